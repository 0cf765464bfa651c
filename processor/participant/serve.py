"""`saga-processor participant run|migrate`: a participant service from its app and `SAGA_*`.

The service gets what a processor process gets: its settings from the environment over the
app's, its dependencies built once and closed on the way out, the HTTP endpoint (/metrics,
/healthz, /readyz) and a stop bounded however it begins (see :mod:`processor.runtime.stopping`).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from processor.errors import LoopDied
from processor.observe.health import Probe, liveness
from processor.observe.server import ObserveServer
from processor.participant.service import ParticipantService
from processor.postgres.connect import connect
from processor.postgres.participant_schema import migrate_participant, migrate_service
from processor.postgres.schema import Tables
from processor.runtime.hooks import Hooks
from processor.runtime.stopping import ShutdownBound, exit_now, on_stop_signals

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from processor.application import ParticipantApp
    from processor.settings import ProcessorSettings

__all__ = ["EXIT_LOOP_DIED", "build_service", "hosted", "migrate", "run_participant"]

log = logging.getLogger(__name__)

EXIT_LOOP_DIED = 70
"""Exit code when the consumer or the relay died (EX_SOFTWARE): restart the process."""


def migrate(settings: ProcessorSettings, app: ParticipantApp | None = None) -> int:
    """Creates or upgrades the participant's tables, and the app's own, in its schema.

    Returns:
        How many of the app's own migrations were applied.
    """
    tables = Tables(settings.participant.schema_name)
    url = settings.database.url.get_secret_value()
    with connect(url, application_name=settings.participant.application_name) as conn:
        migrate_participant(conn, tables)
        applied = migrate_service(conn, tables, app.migrations) if app is not None else 0
    log.info("participant schema %s is up to date (%d new migration(s))", tables.schema, applied)
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
        server = _endpoint(service, settings)
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


def _endpoint(service: ParticipantService, settings: ProcessorSettings) -> ObserveServer | None:
    ms = settings.metrics
    if ms.port == 0 and not ms.bind_any:
        return None
    registry = CollectorRegistry()
    registry.register(_Collector(service, ms.stale_after.total_seconds()))
    stale_after = ms.stale_after.total_seconds()
    server = ObserveServer(
        registry,
        lambda: _healthz(service, stale_after),
        lambda: _readyz(service),
        host=ms.host,
        port=0 if ms.bind_any else ms.port,
    )
    server.start()
    log.info("metrics, /healthz and /readyz on port %d", server.port)
    return server


def _healthz(service: ParticipantService, stale_after: float) -> Probe:
    supervisor = service.supervisor
    loops = supervisor.alive() if supervisor is not None else {}
    return liveness(loops, service.last_step, stale_after)


def _readyz(service: ParticipantService) -> Probe:
    problems = []
    if service.last_step is None:
        problems.append("consumer not started")
    if service.failing:
        problems.append(f"the last {service.failing} batch(es) failed (database or broker away)")
    status = "ready" if not problems else "unready"
    return Probe(not problems, {"status": status, "problems": problems})


class _Collector(Collector):
    """What the kit and the relay did, read when Prometheus scrapes."""

    def __init__(self, service: ParticipantService, stale_after: float) -> None:
        self._service = service
        self._stale_after = stale_after

    def collect(self) -> Iterable[Metric]:
        s = self._service
        c = s.kit.counters
        commands = CounterMetricFamily(
            "saga_participant_commands",
            "Commands the participant service consumed, by outcome.",
            labels=["outcome"],
        )
        for outcome, n in (
            ("handled", c.handled),
            ("duplicate", c.duplicates),
            ("expired", c.expired),
            ("dead-lettered", c.dead_lettered),
            ("skipped", c.skipped),
            ("not-handled", c.not_handled),
        ):
            commands.add_metric([outcome], n)
        yield commands
        replies = CounterMetricFamily(
            "saga_participant_replies", "Replies the handlers queued in the outbox."
        )
        replies.add_metric([], c.replies)
        yield replies
        failed = CounterMetricFamily(
            "saga_participant_failed_batches",
            "Batches rolled back on a transient failure and tried again.",
        )
        failed.add_metric([], s.failed_rounds)
        yield failed
        published = CounterMetricFamily(
            "saga_participant_relay_published", "Replies the relay published and deleted."
        )
        published.add_metric([], s.relay.published)
        yield published
        up = GaugeMetricFamily(
            "saga_participant_up", "1 while every loop of the service runs and the consumer steps."
        )
        up.add_metric([], 1.0 if _healthz(s, self._stale_after).ok else 0.0)
        yield up


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
