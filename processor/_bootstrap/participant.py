"""A participant service over Kafka and the service's PostgreSQL database, and its process.

:class:`ParticipantService` wires
:class:`processor._runtime.participant.service.ParticipantRuntime`: the consumer is the processor's
(positions read from the participant's tables), the relay is the processor's over the participant's
outbox, and the settings are the processor's settings classes. `saga-processor participant
run|migrate` runs it from its app and `SAGA_*` (:func:`run_participant`, :func:`migrate`); a
`SagaApp` hosts one beside a processor (:func:`hosted`). The process gets what a processor process
gets: its settings from the environment over the app's, its dependencies built once and closed on
the way out, the HTTP endpoint and a stop bounded however it begins (see
:mod:`processor._runtime.stopping`).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from processor._authoring.messages import MessageRegistry, registry
from processor._bootstrap.schemas import resolver_for
from processor._bootstrap.service import ServiceAdapters
from processor._errors import LoopDied
from processor._postgres.participant import PostgresParticipantStore
from processor._postgres.schema.citus import Distributed
from processor._postgres.schema.tables import Tables
from processor._runtime.hooks import Hooks
from processor._runtime.participant.observe import participant_endpoint
from processor._runtime.participant.service import SHUTDOWN_TIMEOUT, ParticipantRuntime
from processor._runtime.stopping import ShutdownBound, exit_now, on_stop_signals
from processor.settings import (
    ConsumerSettings,
    KafkaSettings,
    RelaySettings,
    SchemaRegistrySettings,
)

if TYPE_CHECKING:
    from processor._authoring.application import ParticipantApp
    from processor.settings import ProcessorSettings

__all__ = [
    "EXIT_LOOP_DIED",
    "SHUTDOWN_TIMEOUT",
    "ParticipantService",
    "build_service",
    "hosted",
    "migrate",
    "run_participant",
]

log = logging.getLogger(__name__)

EXIT_LOOP_DIED = 70
"""Exit code when the consumer or the relay died (EX_SOFTWARE): restart the process."""


class ParticipantService(ParticipantRuntime):
    """Runs participants against Kafka and the service's PostgreSQL database.

    Args:
        participants: Participant classes (created without arguments) or instances.
        kafka: Client settings (the processor's ``SAGA_KAFKA__*``), or a librdkafka config.
        database_url: The service's own database.
        schema: Schema of the participant's inbox, outbox and positions; created on start.
        group_id: Consumer group; defaults to ``consumer.group_id``.
        topics: Command topics without prefix; defaults to the topics registered for the
            handled command types.
        topic_prefix: Prefix of every topic on the broker.
        consumer: Batch size, timeouts and dead-letter topic (the processor's settings class).
        relay: Relay settings (the processor's settings class).
        settings: Values of ``Setting`` parameters.
        dependencies: Dependencies of handlers, by type.
        message_registry: Where the messages are registered.
        application_name: Shown in ``pg_stat_activity``.
        shutdown_timeout: How long a stop may take, the consumer's close included (half of it
            at most); see :mod:`processor._runtime.stopping` for the process around it.
        hooks: Fault points for tests (see :class:`processor._runtime.hooks.Hooks`).
        distributed: On a Citus coordinator, whether the schema is made a distributed schema
            (the processor's ``SAGA_DATABASE__DISTRIBUTED``; ``auto`` does so for a new one;
            ``buckets`` distributes a new schema's tables by the bucket of each command's key).
        buckets: With ``distributed="buckets"``, a new schema's bucket count
            (``SAGA_PARTICIPANT__BUCKETS``: the command topics' partition count).
        schema_registry: The registry and the topics in its wire format (commands consumed,
            replies sent); None: every topic is our JSON.
    """

    store: PostgresParticipantStore

    def __init__(
        self,
        participants: Sequence[object],
        *,
        kafka: KafkaSettings | Mapping[str, str],
        database_url: str,
        schema: str,
        group_id: str | None = None,
        topics: Sequence[str] | None = None,
        topic_prefix: str = "",
        consumer: ConsumerSettings | None = None,
        relay: RelaySettings | None = None,
        settings: Mapping[str, Any] | None = None,
        dependencies: Mapping[type, object] | None = None,
        message_registry: MessageRegistry = registry,
        application_name: str = "saga-participant",
        shutdown_timeout: timedelta = SHUTDOWN_TIMEOUT,
        hooks: Hooks | None = None,
        distributed: Distributed = "auto",
        schema_registry: SchemaRegistrySettings | None = None,
        buckets: int | None = None,
    ) -> None:
        cs = consumer or ConsumerSettings()
        sr = schema_registry or SchemaRegistrySettings()
        adapters = ServiceAdapters(
            kafka=kafka.client_config() if isinstance(kafka, KafkaSettings) else kafka,
            partitioner=cs.partitioner,
            database_url=database_url,
            schema=schema,
            application_name=application_name,
            # Handlers name the service's tables without the schema: they live in its schema.
            search_path=True,
            distributed=distributed,
            buckets=buckets,
        )
        adapters.migrate()
        self.tables: Tables = adapters.tables

        super().__init__(
            participants,
            store=adapters.participant_store(),
            relay=adapters.relay(
                relay or RelaySettings(), resolver_for(sr, topic_prefix, message_registry)
            ),
            wake_source=adapters.wake_source(),
            consumer=adapters.consumers(cs),
            schema=schema,
            group_id=group_id,
            topics=topics,
            topic_prefix=topic_prefix,
            consumer_settings=cs,
            settings=settings,
            dependencies=dependencies,
            message_registry=message_registry,
            shutdown_timeout=shutdown_timeout,
            hooks=hooks,
            wire=resolver_for(sr, topic_prefix, message_registry),
        )


def participant_buckets(settings: ProcessorSettings) -> int | None:
    """A new participant schema's bucket count: its own setting, else the processor's."""
    own = settings.participant.buckets
    return own if own is not None else settings.database.buckets


def migrate(settings: ProcessorSettings, app: ParticipantApp | None = None) -> int:
    """Creates or upgrades the participant's tables, and the app's own, in its schema.

    Returns:
        How many of the app's own migrations were applied.
    """
    ps = settings.participant
    adapters = ServiceAdapters(
        kafka=settings.kafka.client_config(),
        partitioner=settings.consumer.partitioner,
        database_url=settings.database.url.get_secret_value(),
        schema=ps.schema_name,
        application_name=ps.application_name,
        search_path=True,
        distributed=settings.database.distributed,
        buckets=participant_buckets(settings),
    )
    applied = adapters.migrate(app.migrations if app is not None else None)
    schema = adapters.tables.schema
    log.info("participant schema %s is up to date (%d new migration(s))", schema, applied)
    return applied


def build_service(
    settings: ProcessorSettings,
    app: ParticipantApp,
    dependencies: dict[type, object],
    hooks: Hooks | None = None,
) -> ParticipantService:
    """The service the app names, configured from ``settings``."""
    ps = settings.participant
    return ParticipantService(
        list(app.participants),
        kafka=settings.kafka,
        database_url=settings.database.url.get_secret_value(),
        schema=ps.schema_name,
        group_id=ps.group_id,
        topic_prefix=settings.topic_prefix,
        consumer=settings.consumer,
        relay=settings.relay,
        settings=settings.settings,
        dependencies=dependencies,
        application_name=ps.application_name,
        shutdown_timeout=settings.shutdown_timeout,
        hooks=hooks,
        distributed=settings.database.distributed,
        schema_registry=settings.schema_registry,
        buckets=participant_buckets(settings),
    )


def run_participant(
    settings: ProcessorSettings, app: ParticipantApp, hooks: Hooks | None = None
) -> int:
    """Runs the app's participants until SIGTERM or SIGINT; returns the exit code.

    0 after a clean stop; :data:`EXIT_LOOP_DIED` (70) when the consumer or the relay died on an
    error (logged with its traceback); 3 when the stop overran ``SAGA_SHUTDOWN_TIMEOUT``; 1, after
    a dump of every thread's stack, when no Python thread could run past it.
    """
    with app.open(settings) as dependencies:
        migrate(settings, app)
        service = build_service(settings, app, dependencies, hooks)
        server = participant_endpoint(service, settings.metrics)
        bound = ShutdownBound(settings.shutdown_timeout.total_seconds())
        on_stop_signals(service.stop, bound)
        bound.watch(service.stop_event)
        log.info(
            "participant service %s: group %s, schema %s, topics %s",
            app,
            service.group_id,
            service.tables.schema,
            service.topics,
        )
        code = 0
        try:
            service.run()
        except LoopDied as e:
            print(f"saga-processor: {e}", file=sys.stderr)
            code = EXIT_LOOP_DIED
        finally:
            if server is not None:
                server.close()
    if service.left_running:
        # A close still waits on the broker; the interpreter's finalisation would wait on it.
        exit_now(code)
    return code


@contextmanager
def hosted(
    settings: ProcessorSettings,
    app: ParticipantApp | None,
    dependencies: dict[type, object],
    on_died: Callable[[], None],
) -> Iterator[ParticipantService | None]:
    """Runs ``app``'s participants on a thread beside a processor (a `SagaApp` hosting them).

    They share the processor's dependencies and settings (`SAGA_PARTICIPANT__*` for their
    schema and group). A loop of theirs that dies calls ``on_died`` (the processor stops, and the
    process exits for the platform to restart it); leaving stops them within the shutdown budget.
    """
    if app is None:
        yield None
        return
    migrate(settings, app)
    service = build_service(settings, app, dependencies)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            service.run()
        except BaseException as e:  # a loop died: the whole process goes
            failed.append(e)
            log.error("hosted participants stopped: %s", e)
            on_died()

    thread = threading.Thread(target=run, name="participants", daemon=True)
    thread.start()
    log.info("hosting participants %s: group %s", app, service.group_id)
    try:
        yield service
    finally:
        service.stop()
        thread.join(settings.shutdown_timeout.total_seconds())
        if thread.is_alive():
            service.left_running.append("participants")
