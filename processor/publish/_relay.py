"""The outbox relay runner: publishes to Kafka what a service's outbox table committed.

:class:`OutboxRelay` runs the processor's relay over one schema's outbox, woken by each commit,
producing with the same partitioner as :class:`~processor.publish._kafka.EventPublisher`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from types import TracebackType

from processor._authoring.messages import MessageRegistry
from processor._authoring.messages import registry as default_registry
from processor._bootstrap.schemas import resolver_for
from processor._bootstrap.service import ServiceAdapters
from processor._errors import LoopDied
from processor._runtime.supervisor import Supervisor
from processor.publish._kafka import _client_config, _partitioner
from processor.settings import KafkaSettings, RelaySettings, SchemaRegistrySettings

__all__ = ["OutboxRelay"]

log = logging.getLogger(__name__)


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
        schema_registry: The registry and the topics in its wire format; None: every topic
            is our JSON.
        registry: Where the messages are registered (their schemas, for framed topics).
        topic_prefix: Prefix of every topic on the broker, as the framed topics are named.
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
        schema_registry: SchemaRegistrySettings | None = None,
        registry: MessageRegistry = default_registry,
        topic_prefix: str = "",
    ) -> None:
        rs = settings or RelaySettings()
        adapters = ServiceAdapters(
            kafka=_client_config(kafka),
            partitioner=_partitioner(partitioner),
            database_url=database_url,
            schema=schema,
            application_name=application_name,
            search_path=False,
        )
        self.tables = adapters.tables
        self.shutdown_timeout = shutdown_timeout
        adapters.migrate()
        wire = (
            resolver_for(schema_registry, topic_prefix, registry)
            if schema_registry is not None
            else None
        )
        self.relay = adapters.relay(rs, wire)
        self._listener = adapters.wake_source()
        self.stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

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
        listener = self._listener
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
