"""The metrics, the sampler, the probes and the spans of a running processor.

Built by the composition root (:mod:`processor._bootstrap.processor`) from the parts it watches,
the loops being made first: the processor only starts and closes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from processor._engine.rows import WriteSet
from processor._observe.health import Probe, liveness, readiness
from processor._observe.metrics import Metrics
from processor._observe.sampler import Sampler
from processor._observe.server import ObserveServer
from processor._ports.cluster import DatabaseSample
from processor._ports.factory import DatabaseGauges
from processor._runtime.consumer.lane import Lane, Stuck
from processor._runtime.consumer.worker import BatchDone, Worker
from processor._runtime.relay import Relay
from processor._runtime.supervisor import Supervisor
from processor.settings import MetricsSettings

__all__ = ["Observability", "Watched", "batch_metrics"]

log = logging.getLogger(__name__)


def batch_metrics(metrics: Metrics) -> Callable[[BatchDone, WriteSet], None]:
    """What the worker reports each committed batch to: the batch's and its writes' metrics."""

    def on_batch(done: BatchDone, ws: WriteSet) -> None:
        metrics.batch(done.records, done.topics, done.plan_seconds, done.commit_seconds)
        metrics.committed(ws)

    return on_batch


@dataclass(frozen=True)
class Watched:
    """The parts of a processor the metrics and probes read.

    Attributes:
        worker: The consumer loop (its stats, consumer, placement check and health).
        relay: The outbox relay; None when relaying is disabled.
        loops: Which loops are alive, by name (``Processor.health``).
        supervisor: Runs the sampler as a supervised loop.
        gauges: Opens the database sampler's connection.
        schema_version: The schema version this code expects (``/readyz``).
    """

    worker: Worker
    relay: Relay | None
    loops: Callable[[], dict[str, bool]]
    supervisor: Supervisor
    gauges: Callable[[], DatabaseGauges]
    schema_version: int


class Observability:
    """The metrics registry, database sampler and HTTP endpoint of one processor.

    Args:
        metrics: The registry, made first: the loops feed it (the poller's fire lags, the
            worker's batches).
        watched: What the feeds and probes read.
        settings: The endpoint's host, port and sampling.

    Attributes:
        sampler: The database sampler; None when the endpoint is disabled.
        server: The HTTP endpoint once started; None before, or when disabled
            (``metrics.port`` 0).
    """

    def __init__(self, metrics: Metrics, watched: Watched, settings: MetricsSettings) -> None:
        self.metrics = metrics
        self._w = watched
        self.sampler: Sampler | None = None
        self.server: ObserveServer | None = None
        self._stale_after = settings.stale_after.total_seconds()
        src = metrics.sources
        src.relay = watched.relay
        src.up = lambda: self.healthz().ok
        src.worker_stats = watched.worker.stats
        placement = watched.worker.placement
        if placement is not None:
            src.off_partition = placement.off_partition
            src.stale_producers = placement.stale
        if settings.port == 0 and not settings.bind_any:
            return
        self._gauges = _BoundedGauges(
            watched.gauges,
            # A sample that takes longer than an interval (the database black-holed) fails, so
            # /readyz says so within about one interval; never less than 10 s, which a healthy
            # database under load may need, nor more than a sample stays good.
            bound=min(self._stale_after, max(settings.sample_interval.total_seconds(), 10.0)),
        )
        self.sampler = Sampler(
            self._gauges.sample, metrics, settings.sample_interval.total_seconds()
        )
        self._listen = (settings.host, 0 if settings.bind_any else settings.port)

    def start(self) -> None:
        """Starts the sampler (a supervised loop) and the HTTP endpoint."""
        consumer = self._w.worker.consumer
        self.metrics.sources.rebalances = getattr(consumer, "rebalances", None)
        if self.sampler is not None:
            self.sampler.high_watermarks = getattr(consumer, "high_watermarks", None)
            self._w.supervisor.spawn("metrics-sampler", self.sampler.run)
            # Bound here, not when built: the processor checks first that the port is free.
            host, port = self._listen
            self.server = ObserveServer(
                self.metrics.registry, self.healthz, self.readyz, host=host, port=port
            )
            self.server.start()
            log.info("metrics, /healthz and /readyz on port %d", self.server.port)

    @property
    def port(self) -> int | None:
        """The endpoint's bound port; None when disabled."""
        return None if self.server is None else self.server.port

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.sampler is not None:
            self._gauges.close()

    # -- probes ----------------------------------------------------------------------------------

    def healthz(self) -> Probe:
        return liveness(self._w.loops(), self._w.worker.stats.last_step, self._stale_after)

    def readyz(self) -> Probe:
        s = self.sampler
        return readiness(
            sample_age=s.age() if s is not None else None,
            sample_error=s.last_error if s is not None else None,
            schema_version=s.latest.schema_version if s is not None and s.latest else None,
            expected_version=self._w.schema_version,
            worker=self._w.worker.health(),
            stale_after=self._stale_after,
        )


class _BoundedGauges:
    """Takes each sample on a lane (processor/_runtime/consumer/lane.py) and waits a bounded time.

    Behind a black-holed network a query never returns and never fails, and its connection
    stays wedged after the network heals: a sampler blocked on it would stop sampling for good
    and keep /readyz failing after the database is back. On timeout the lane is abandoned with
    its connection, and the next sample starts on a fresh lane and a fresh connection.
    """

    def __init__(self, make: Callable[[], DatabaseGauges], bound: float) -> None:
        self._make = make
        self._bound = bound
        self._gauges = make()
        self._lane = Lane("metrics-sample")

    def sample(self) -> DatabaseSample:
        try:
            return self._lane.call(self._gauges.sample, self._bound)
        except Stuck:
            # The stuck call keeps the old gauges (and connection) on its abandoned thread.
            self._lane.close()
            self._lane = Lane("metrics-sample")
            self._gauges = self._make()
            raise

    def close(self) -> None:
        # Queued behind any running sample, so the connection is not closed under it.
        self._lane.submit(self._gauges.close)
        self._lane.close()
