"""Publishing domain events the way the processor reads them.

Services that feed sagas send events with the headers the processor reads (``message-id``,
``message-type``, ``schema-version``, ``correlation-id``, ``occurred-at``, the W3C trace
context), keyed by the saga's id so that one saga's events stay in order on one partition, and
partitioned as the processor's own producers partition (``SAGA_CONSUMER__PARTITIONER``).

- :class:`EventPublisher` produces them directly: ``publish`` queues, ``flush`` waits and
  raises :class:`PublishFailed` naming each record that did not get through.
- :class:`OutboxEventPublisher` writes them to the service's outbox table in the service's own
  transaction; :class:`OutboxRelay` (the processor's relay) publishes what committed.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from processor.definition import SagaState, definition_of
from processor.engine.decode import id_problem
from processor.engine.partitioner import Partitioner, normalise
from processor.engine.records import OutboxRow
from processor.errors import LoopDied, SagaError
from processor.kafka.producer import KafkaRecordProducer, make_producer, relay_overrides
from processor.kafka.tracked import FailedDelivery, TrackedProducer
from processor.messages import Message, MessageRegistry
from processor.messages import registry as default_registry
from processor.postgres.connect import connect
from processor.postgres.events import AnyConnection, insert_events
from processor.postgres.notify import PostgresWakeSource
from processor.postgres.outbox import PostgresOutboxStore
from processor.postgres.participant_schema import migrate_participant
from processor.postgres.schema import Tables
from processor.runtime.relay import Relay
from processor.runtime.supervisor import Supervisor
from processor.settings import (
    ConsumerSettings,
    KafkaSettings,
    ProcessorSettings,
    RelaySettings,
    load_settings,
)
from processor.wire import (
    HEADER_CAUSATION_ID,
    HEADER_CORRELATION_ID,
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_OCCURRED_AT,
    HEADER_SCHEMA_VERSION,
    HEADER_TRACEPARENT,
    HEADER_TRACESTATE,
    Topics,
    outbox_channel,
)

__all__ = [
    "EventPublisher",
    "EventRecordBuilder",
    "FailedDelivery",
    "OutboxEventPublisher",
    "OutboxRelay",
    "PublishFailed",
]

log = logging.getLogger(__name__)

try:  # the optional extra
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: TraceContextTextMapPropagator | None = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    _PROPAGATOR = None

# Headers the publisher sets from its arguments; given in ``headers=`` they would contradict them.
_RESERVED = {
    HEADER_MESSAGE_ID: "message_id=",
    HEADER_MESSAGE_TYPE: "the message's registration",
    HEADER_SCHEMA_VERSION: "the message's registration",
    HEADER_CORRELATION_ID: "correlation_id=",
    HEADER_CAUSATION_ID: "causation_id=",
    HEADER_OCCURRED_AT: "occurred_at=",
}

# Shown per failure in a PublishFailed's text; all of them are in its ``failures``.
_SHOWN = 5


class PublishFailed(SagaError):
    """Events the broker did not acknowledge; none of them is dropped silently.

    Attributes:
        failures: One :class:`FailedDelivery` per event, in publishing order: its topic, its
            message id and the client's reason (never the payload).
        permanent: True when some event can never be sent as it is (too large, no such topic).
    """

    def __init__(self, failures: list[FailedDelivery]) -> None:
        self.failures = failures
        self.permanent = any(f.permanent for f in failures)
        shown = "; ".join(
            f"{f.topic} message-id {f.message_id}: {f.reason}" for f in failures[:_SHOWN]
        )
        more = f"; and {len(failures) - _SHOWN} more" if len(failures) > _SHOWN else ""
        super().__init__(f"{len(failures)} event(s) not delivered: {shown}{more}")


def current_trace_headers() -> dict[str, str]:
    """``traceparent`` (and ``tracestate``) of the active OpenTelemetry span; empty without one."""
    if _PROPAGATOR is None or not _trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return {k: v for k, v in carrier.items() if k in (HEADER_TRACEPARENT, HEADER_TRACESTATE)}


class EventRecordBuilder:
    """Turns a message into the record the processor reads: topic, key, headers and value.

    Args:
        topic_prefix: Prefix of every topic on the broker (``SAGA_TOPIC_PREFIX``).
        sagas: Saga classes whose association properties give the key of the events they
            handle, when ``key`` is not given.
        registry: Where the messages are registered.
    """

    def __init__(
        self,
        *,
        topic_prefix: str = "",
        sagas: Iterable[type[SagaState]] = (),
        registry: MessageRegistry = default_registry,
    ) -> None:
        self._topics = Topics(topic_prefix)
        self._registry = registry
        self._definitions = [definition_of(s) for s in sagas]

    def key_for(self, message: Message) -> str:
        """The value of the association property of the sagas that handle ``message``.

        Raises:
            ValueError: No saga given handles the message's type, its value is missing or
                empty, or two sagas read different values from it.
        """
        name = self._registry.of(type(message)).name
        handling = [d for d in self._definitions if d.handles(type(message))]
        if not handling:
            raise ValueError(
                f"no saga given handles {name} ({type(message).__qualname__}), so its key is "
                "unknown: pass key=..., or the sagas that handle it in sagas=[...]"
            )
        values = {d.saga_type: d.association_value(message) for d in handling}
        empty = sorted(t for t, v in values.items() if v is None)
        if empty:
            props = {d.event_handlers[type(message)].association_property for d in handling}
            raise ValueError(
                f"{name}: the association property ({', '.join(sorted(map(str, props)))}) of "
                f"saga {', '.join(empty)} is empty; pass key=..."
            )
        distinct = {v for v in values.values() if v is not None}
        if len(distinct) > 1:
            raise ValueError(
                f"{name} is handled by sagas that read different keys from it "
                f"({', '.join(sorted(values))}); pass key=..."
            )
        return distinct.pop()

    def build(
        self,
        message: Message,
        *,
        key: str | None = None,
        message_id: str | None = None,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        occurred_at: datetime | None = None,
        headers: Mapping[str, str] | None = None,
        topic: str | None = None,
    ) -> OutboxRow:
        """The record of ``message``; see :meth:`EventPublisher.publish` for the arguments.

        The row's ``saga_type`` and ``saga_id`` (what an outbox orders rows by) are the type of
        the first saga given that handles the message (else the topic) and the key.

        Raises:
            UnknownMessageType: The message's class is not registered.
            ValueError: No topic, no key, or an id, key or header the processor would refuse.
        """
        cls = type(message)
        mtype = self._registry.of(cls)
        if topic is None:
            if mtype.topic is None:
                raise ValueError(
                    f"{mtype.name} has no topic: register it with @message_type(..., topic=...) "
                    "or pass topic=..."
                )
            topic = self._topics.name(mtype.topic)
        if key is None:
            key = self.key_for(message)
        if message_id is None:
            message_id = str(uuid.uuid4())
        for what, text in (("key", key), ("message id", message_id)):
            problem = id_problem(text) if text else "is empty"
            if problem is not None:
                raise ValueError(f"{mtype.name}: the {what} {problem}")
        extra = dict(headers or {})
        for name, text in extra.items():
            if name in _RESERVED:
                raise ValueError(f"header {name!r} is set by the publisher: use {_RESERVED[name]}")
            if "\x00" in name or "\x00" in text:
                raise ValueError(f"header {name!r} holds a NUL character")
        when = occurred_at if occurred_at is not None else datetime.now(UTC)
        if when.tzinfo is None:
            raise ValueError("occurred_at needs a time zone (e.g. datetime.now(UTC))")
        out = {
            # The caller's own trace context, if given, wins over the active span's.
            **current_trace_headers(),
            **extra,
            HEADER_MESSAGE_ID: message_id,
            HEADER_MESSAGE_TYPE: mtype.name,
            HEADER_SCHEMA_VERSION: str(mtype.version),
            # An event nobody caused starts a conversation: its own id names it.
            HEADER_CORRELATION_ID: correlation_id or message_id,
            HEADER_OCCURRED_AT: when.isoformat(),
        }
        if causation_id is not None:
            out[HEADER_CAUSATION_ID] = causation_id
        handling = [d.saga_type for d in self._definitions if d.handles(cls)]
        return OutboxRow(
            saga_type=handling[0] if handling else topic,
            saga_id=key,
            topic=topic,
            key=key.encode(),
            headers=out,
            value=message.model_dump_json().encode(),
        )


def _partitioner(partitioner: str | None) -> Partitioner:
    return normalise(partitioner) if partitioner is not None else ConsumerSettings().partitioner


def _client_config(kafka: KafkaSettings | Mapping[str, str]) -> dict[str, str]:
    # A copy: the caller's mapping is never changed, nor shared with the client.
    return dict(kafka.client_config() if isinstance(kafka, KafkaSettings) else kafka)


# Every delivery is reported (not only failures), so that a flush can name the records still
# unacknowledged; and one refused record fails alone rather than stopping the producer for every
# later one (the gap-less guarantee would make any refusal fatal).
_PUBLISHER_OVERRIDES = {"delivery.report.only.error": False, "enable.gapless.guarantee": False}


class EventPublisher:
    """Publishes events to Kafka with the processor's headers, key and partitioner.

    ``publish`` queues an event and returns at once; ``flush`` waits for the broker and raises
    :class:`PublishFailed` for any event it did not acknowledge. As a context manager it flushes
    and closes on exit.

    Args:
        kafka: Client settings (the processor's ``SAGA_KAFKA__*``), or a librdkafka config.
        partitioner: ``crc32`` or ``murmur2`` (or librdkafka's names for them): the one the
            processor's producers use (``SAGA_CONSUMER__PARTITIONER``); its default when None.
        topic_prefix: Prefix of every topic on the broker (``SAGA_TOPIC_PREFIX``).
        sagas: Saga classes whose association properties key the events they handle.
        registry: Where the messages are registered.

    Attributes:
        partitioner: The partitioner in use.
        records: Builds each event's record (also usable on a producer of the caller's own).

    Example:
        >>> with EventPublisher({"bootstrap.servers": "kafka:9092"}, sagas=[TransferSaga]) as p:
        ...     p.publish(TransferRequested(transfer_id="t-1", ...))  # doctest: +SKIP
    """

    def __init__(
        self,
        kafka: KafkaSettings | Mapping[str, str],
        *,
        partitioner: str | None = None,
        topic_prefix: str = "",
        sagas: Iterable[type[SagaState]] = (),
        registry: MessageRegistry = default_registry,
    ) -> None:
        config = _client_config(kafka)
        chosen = self.partitioner = _partitioner(partitioner)
        self.records = EventRecordBuilder(topic_prefix=topic_prefix, sagas=sagas, registry=registry)
        self._sender = TrackedProducer(
            lambda: make_producer(config, partitioner=chosen, **_PUBLISHER_OVERRIDES)
        )
        self._closed = False

    @classmethod
    def from_settings(
        cls,
        settings: ProcessorSettings | None = None,
        *,
        sagas: Iterable[type[SagaState]] | None = None,
        registry: MessageRegistry = default_registry,
    ) -> EventPublisher:
        """A publisher configured as the processor is: Kafka, partitioner and topic prefix.

        Args:
            settings: The processor's settings; None reads the ``SAGA_*`` environment once, as
                the processor does (a bad or misspelt variable is a ``ConfigurationError``).
                A publisher needs no database: ``SAGA_DATABASE__URL`` may be left unset.
            sagas: Saga classes keying the events; None loads ``settings.sagas`` (none when
                that is empty: then every publish needs ``key=``).
            registry: Where the messages are registered.
        """
        if settings is None:
            settings = load_settings(defaults={"database": {"url": "unused-by-publishers"}})
        if sagas is None:
            from processor.runtime.assembly import load_saga_classes

            sagas = load_saga_classes(settings.sagas)
        return cls(
            settings.kafka,
            partitioner=settings.consumer.partitioner,
            topic_prefix=settings.topic_prefix,
            sagas=sagas,
            registry=registry,
        )

    @property
    def producer(self) -> Any:
        """The confluent-kafka producer, for records this publisher does not build."""
        return self._sender.producer

    def publish(
        self,
        message: Message,
        *,
        key: str | None = None,
        message_id: str | None = None,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        occurred_at: datetime | None = None,
        headers: Mapping[str, str] | None = None,
        topic: str | None = None,
    ) -> str:
        """Queues ``message`` on its registered topic; :meth:`flush` reports how it went.

        Args:
            message: A registered message.
            key: The record key; by default the association value of the sagas given that
                handle the message's type.
            message_id: A new UUID by default. Give a stable one to publish the same event
                again (a retry): the processor applies one message id once.
            correlation_id: The conversation; the message id by default.
            causation_id: The id of the message that caused this one, if any.
            occurred_at: When it happened (with a time zone); now by default.
            headers: More headers; the active OpenTelemetry span's ``traceparent`` and
                ``tracestate`` are added unless given here.
            topic: The topic on the broker, as is (no prefix added); the message's registered
                topic, prefixed, by default.

        Returns:
            The message id.

        Raises:
            UnknownMessageType: The message's class is not registered.
            ValueError: No topic, no key, or an id, key or header the processor would refuse.
            RuntimeError: The publisher is closed.
        """
        if self._closed:
            raise RuntimeError("the event publisher is closed")
        row = self.records.build(
            message,
            key=key,
            message_id=message_id,
            correlation_id=correlation_id,
            causation_id=causation_id,
            occurred_at=occurred_at,
            headers=headers,
            topic=topic,
        )
        sent_id = row.headers[HEADER_MESSAGE_ID]
        self._sender.produce(row.topic, row.key, row.value, row.headers, sent_id)
        return sent_id

    def flush(self, timeout: float = 30.0) -> None:
        """Waits up to ``timeout`` seconds for every event published since the last flush.

        Raises:
            PublishFailed: Some were refused (too large, no such topic, not authorized) or not
                acknowledged in time; each is named by topic and message id. A flush reports
                each failure once.
        """
        failures = self._sender.flush(timeout)
        if failures:
            raise PublishFailed(failures)

    def close(self, timeout: float = 30.0) -> None:
        """Flushes, then refuses further events.

        Raises:
            PublishFailed: As :meth:`flush`.
        """
        if self._closed:
            return
        self._closed = True
        self.flush(timeout)

    def __enter__(self) -> EventPublisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except PublishFailed as e:
            # The block's own exception is what the caller must see; this one is logged.
            log.warning("%s", e)


class OutboxEventPublisher:
    """Writes events to the service's outbox table, in the caller's own transaction.

    The table is the participant kit's outbox in ``schema`` (created by :meth:`migrate`), so a
    service that runs participants shares it with their replies, and their relay publishes
    both; otherwise run an :class:`OutboxRelay` on the schema. An event goes out only once the
    caller's transaction commits, at least once, with the headers :class:`EventPublisher`
    sets; rows of one key are published in order.

    Args:
        schema: The schema holding the outbox (the participant service's ``schema``).
        topic_prefix: Prefix of every topic on the broker (``SAGA_TOPIC_PREFIX``).
        sagas: Saga classes whose association properties key the events they handle.
        registry: Where the messages are registered.
    """

    def __init__(
        self,
        schema: str,
        *,
        topic_prefix: str = "",
        sagas: Iterable[type[SagaState]] = (),
        registry: MessageRegistry = default_registry,
    ) -> None:
        self.tables = Tables(schema)
        self.records = EventRecordBuilder(topic_prefix=topic_prefix, sagas=sagas, registry=registry)

    def migrate(self, conn: AnyConnection) -> None:
        """Creates the schema's outbox tables, if missing (the participant kit's migrations)."""
        migrate_participant(conn, self.tables)

    def publish(
        self,
        conn: AnyConnection,
        message: Message,
        *,
        key: str | None = None,
        message_id: str | None = None,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        occurred_at: datetime | None = None,
        headers: Mapping[str, str] | None = None,
        topic: str | None = None,
    ) -> str:
        """Inserts ``message`` into the outbox within ``conn``'s current transaction.

        Arguments as :meth:`EventPublisher.publish`; the trace context is the active span's
        when this is called.

        Returns:
            The message id.

        Raises:
            ValueError: As :meth:`EventPublisher.publish`, or ``conn`` is in autocommit mode
                outside a transaction block.
        """
        row = self.records.build(
            message,
            key=key,
            message_id=message_id,
            correlation_id=correlation_id,
            causation_id=causation_id,
            occurred_at=occurred_at,
            headers=headers,
            topic=topic,
        )
        insert_events(conn, self.tables, [row])
        return row.headers[HEADER_MESSAGE_ID]


class OutboxRelay:
    """Publishes a service's outbox: the processor's relay over the schema's outbox table.

    Run it as a context manager (in the background, stopped on exit), or call :meth:`run` from
    the service's main thread. A ``ParticipantService`` on the same schema already runs one.

    Args:
        kafka: Client settings (the processor's ``SAGA_KAFKA__*``), or a librdkafka config.
        database_url: The service's database.
        schema: The schema of the outbox; its tables are created if missing.
        partitioner: As for :class:`EventPublisher`.
        settings: Batch sizes, timeouts and attempts (the processor's relay settings).
        application_name: Shown in ``pg_stat_activity``.
        shutdown_timeout: How long a stop may take, in seconds.
    """

    def __init__(
        self,
        *,
        kafka: KafkaSettings | Mapping[str, str],
        database_url: str,
        schema: str,
        partitioner: str | None = None,
        settings: RelaySettings | None = None,
        application_name: str = "saga-event-relay",
        shutdown_timeout: float = 20.0,
    ) -> None:
        config = _client_config(kafka)
        chosen = _partitioner(partitioner)
        rs = settings or RelaySettings()
        self._url = database_url
        self._app = application_name
        self.tables = Tables(schema)
        self.shutdown_timeout = shutdown_timeout
        with connect(database_url, application_name=application_name) as conn:
            migrate_participant(conn, self.tables)
        self.relay = Relay(
            PostgresOutboxStore(self._connect, self.tables),
            KafkaRecordProducer(
                lambda: make_producer(
                    config, partitioner=chosen, **relay_overrides(rs.max_record_bytes)
                )
            ),
            batch_size=rs.batch_size,
            max_batch_bytes=rs.max_batch_bytes,
            poll_interval=rs.poll_interval.total_seconds(),
            flush_timeout=rs.flush_timeout.total_seconds(),
            max_attempts=rs.max_attempts,
            max_record_bytes=rs.max_record_bytes,
        )
        self.stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _connect(self) -> Any:
        return connect(self._url, application_name=self._app)

    def run_once(self) -> int:
        """Publishes one round of committed rows; returns how many went out."""
        return self.relay.run_once()

    def run(self, stop: threading.Event | None = None) -> None:
        """Publishes until ``stop`` (or :attr:`stop_event`) is set; woken by each commit.

        Raises:
            LoopDied: The relay met a fatal failure (transient ones are retried).
        """
        stop = stop or self.stop_event
        supervisor = Supervisor(stop)
        supervisor.spawn("event-relay", self.relay.run)
        listener = PostgresWakeSource(self._connect, outbox_channel(self.tables.schema))
        supervisor.spawn("event-relay-listener", lambda s: listener.run(s, self.relay.wake.set))
        stop.wait()
        ends = time.monotonic() + self.shutdown_timeout
        stuck = supervisor.join(lambda: ends - time.monotonic())
        if stuck:
            log.warning("loops still running at the end of the shutdown budget: %s", stuck)
        self.relay.close()
        failure = supervisor.failure
        if failure is not None:
            raise LoopDied(failure.describe())

    def stop(self) -> None:
        """Asks :meth:`run` to return."""
        self.stop_event.set()

    def __enter__(self) -> OutboxRelay:
        def target() -> None:
            try:
                self.run()
            except BaseException as e:  # raised again on exit
                self._error = e

        self._thread = threading.Thread(target=target, name="event-relay-main", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if self._thread is not None:
            self._thread.join(self.shutdown_timeout + 5)
        if self._error is not None and exc is None:
            raise self._error
