"""The synchronous event publisher: events produced straight to Kafka.

:class:`EventPublisher` keys and partitions events as the processor's own producers do
(``SAGA_CONSUMER__PARTITIONER``): ``publish`` queues, ``flush`` waits and raises
:class:`PublishFailed` naming each record that did not get through.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Unpack

from processor._authoring.definition import SagaState
from processor._authoring.messages import Message, MessageRegistry
from processor._authoring.messages import registry as default_registry
from processor._bootstrap.clients import FailedDelivery, tracked_producer
from processor._bootstrap.schemas import resolver_for
from processor._engine.partitioner import Partitioner, normalise
from processor._errors import SagaError
from processor._wire import HEADER_MESSAGE_ID
from processor.publish._records import EventRecordBuilder, PublishOptions
from processor.settings import (
    ConsumerSettings,
    KafkaSettings,
    ProcessorSettings,
    SchemaRegistrySettings,
    load_settings,
)

__all__ = ["EventPublisher", "FailedDelivery", "PublishFailed"]

log = logging.getLogger(__name__)

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
        schema_registry: The registry and the topics in its wire format
            (``SAGA_SCHEMA_REGISTRY__*``): an event for a framed topic is framed, its schema
            registered or looked up on its first publish; None: every topic is our JSON.

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
        schema_registry: SchemaRegistrySettings | None = None,
    ) -> None:
        config = _client_config(kafka)
        self._wire = (
            resolver_for(schema_registry, topic_prefix, registry)
            if schema_registry is not None
            else None
        )
        chosen = self.partitioner = _partitioner(partitioner)
        self.records = EventRecordBuilder(topic_prefix=topic_prefix, sagas=sagas, registry=registry)
        self._sender = tracked_producer(config, chosen, _PUBLISHER_OVERRIDES)
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
            from processor._runtime.assembly import load_saga_classes

            sagas = load_saga_classes(settings.sagas)
        return cls(
            settings.kafka,
            partitioner=settings.consumer.partitioner,
            topic_prefix=settings.topic_prefix,
            sagas=sagas,
            registry=registry,
            schema_registry=settings.schema_registry,
        )

    @property
    def producer(self) -> Any:
        """The confluent-kafka producer, for records this publisher does not build."""
        return self._sender.producer

    def publish(self, message: Message, **options: Unpack[PublishOptions]) -> str:
        """Queues ``message`` on its registered topic; :meth:`flush` reports how it went.

        Args:
            message: A registered message.
            **options: ``key``, ``message_id``, ``correlation_id``, ``causation_id``,
                ``occurred_at``, ``headers``, ``topic``: see :class:`PublishOptions`.

        Returns:
            The message id.

        Raises:
            UnknownMessageType: The message's class is not registered.
            ValueError: No topic, no key, or an id, key or header the processor would refuse.
            RuntimeError: The publisher is closed.
            Retryable: The topic is framed and its schema registry could not be reached (or
                refused the schema): nothing was queued.
        """
        if self._closed:
            raise RuntimeError("the event publisher is closed")
        row = self.records.build(message, **options)
        sent_id = row.headers[HEADER_MESSAGE_ID]
        value = row.value
        if self._wire is not None:
            self._wire.prepare_out([row])
            value = self._wire.wire.frame(row)
        self._sender.produce(row.topic, row.key, value, row.headers, sent_id)
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
        try:
            self.flush(timeout)
        finally:
            if self._wire is not None:
                self._wire.close()

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
