"""The HTTP endpoint of a participant service: /metrics, /healthz and /readyz.

What the kit and the relay did is read when Prometheus scrapes; the probes read the loops the
service's supervisor runs and when its consumer loop last stepped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from processor._observe.health import Probe, liveness
from processor._observe.server import ObserveServer
from processor._runtime.participant.service import ParticipantRuntime
from processor.settings import MetricsSettings

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["participant_endpoint"]

log = logging.getLogger(__name__)


def participant_endpoint(service: ParticipantRuntime, ms: MetricsSettings) -> ObserveServer | None:
    """Starts the service's endpoint as ``ms`` configures it; None when it is disabled."""
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


def _healthz(service: ParticipantRuntime, stale_after: float) -> Probe:
    supervisor = service.supervisor
    loops = supervisor.alive() if supervisor is not None else {}
    return liveness(loops, service.last_step, stale_after)


def _readyz(service: ParticipantRuntime) -> Probe:
    problems = []
    if service.last_step is None:
        problems.append("consumer not started")
    if service.failing:
        problems.append(f"the last {service.failing} batch(es) failed (database or broker away)")
    status = "ready" if not problems else "unready"
    return Probe(not problems, {"status": status, "problems": problems})


class _Collector(Collector):
    """What the kit and the relay did, read when Prometheus scrapes."""

    def __init__(self, service: ParticipantRuntime, stale_after: float) -> None:
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
