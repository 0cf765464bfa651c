"""Wires the metrics, the sampler, the probes and the spans into a running processor.

Kept apart from :mod:`processor.runtime.processor` so that the processor says only where it
calls in (start, each committed batch, shutdown), and this module what happens there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from processor.engine.rows import WriteSet
from processor.observe.health import Probe, liveness, readiness
from processor.observe.metrics import Metrics
from processor.observe.sampler import Sampler
from processor.observe.server import ObserveServer
from processor.observe.tracing import tracing
from processor.ports.cluster import DatabaseSample
from processor.ports.factory import DatabaseGauges
from processor.runtime.lane import Lane, Stuck
from processor.runtime.worker import BatchDone, BatchObservers

if TYPE_CHECKING:
    from processor.runtime.processor import Processor

__all__ = ["Observability"]

log = logging.getLogger(__name__)


class Observability:
    """The metrics registry, database sampler, HTTP endpoint and spans of one processor.

    Args:
        processor: The processor to watch; its relay and poller already exist, its worker is
            made after this (with :attr:`batches`) and before :meth:`start`.

    Attributes:
        metrics: The registry and its feeds.
        sampler: The database sampler; None when the endpoint is disabled.
        server: The HTTP endpoint; None when disabled (``metrics.port`` 0).
        batches: The metrics and spans of each batch, for the worker.
    """

    def __init__(self, processor: Processor) -> None:
        self._p = processor
        ms = processor.settings.metrics
        self.metrics = Metrics(replica=processor.instance_id)
        self.sampler: Sampler | None = None
        self.server: ObserveServer | None = None
        self._stale_after = ms.stale_after.total_seconds()
        src = self.metrics.sources
        src.relay = processor.relay
        src.up = lambda: self.healthz().ok
        if processor.poller is not None:
            processor.poller.on_fired = self.metrics.fired
        spans = tracing()
        # Given to the worker, which is made after this (it reports each batch here).
        self.batches = BatchObservers(on_batch=self._batch, tracing=spans)
        if spans is not None:
            processor.planner.handler_span = lambda t, i, r: spans.handler(t, i, r.headers_text())
            if processor.relay is not None:
                processor.relay.tracing = spans
        if ms.port == 0 and not ms.bind_any:
            return
        self._gauges = _BoundedGauges(
            processor.adapters.gauges,
            # A sample that takes longer than an interval (the database black-holed) fails, so
            # /readyz says so within about one interval; never less than 10 s, which a healthy
            # database under load may need, nor more than a sample stays good.
            bound=min(self._stale_after, max(ms.sample_interval.total_seconds(), 10.0)),
        )
        self.sampler = Sampler(
            self._gauges.sample, self.metrics, ms.sample_interval.total_seconds()
        )
        self.server = ObserveServer(
            self.metrics.registry,
            self.healthz,
            self.readyz,
            host=ms.host,
            port=0 if ms.bind_any else ms.port,
        )

    def start(self) -> None:
        """Starts the sampler (a supervised loop) and the HTTP endpoint."""
        if self._p.worker is not None:
            self.metrics.sources.worker_stats = self._p.worker.stats
        consumer = self._p.worker.consumer if self._p.worker is not None else None
        self.metrics.sources.rebalances = getattr(consumer, "rebalances", None)
        placement = self._p.worker.placement if self._p.worker is not None else None
        if placement is not None:
            self.metrics.sources.off_partition = placement.off_partition
            self.metrics.sources.stale_producers = placement.stale
        if self.sampler is not None:
            self.sampler.high_watermarks = getattr(consumer, "high_watermarks", None)
            self._p.supervisor.spawn("metrics-sampler", self.sampler.run)
        if self.server is not None:
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

    # -- feeds -----------------------------------------------------------------------------------

    def _batch(self, done: BatchDone, ws: WriteSet) -> None:
        self.metrics.batch(done.records, done.topics, done.plan_seconds, done.commit_seconds)
        self.metrics.committed(ws)

    # -- probes ----------------------------------------------------------------------------------

    def healthz(self) -> Probe:
        worker = self._p.worker
        last = worker.stats.last_step if worker is not None else None
        return liveness(self._p.health(), last, self._stale_after)

    def readyz(self) -> Probe:
        s = self.sampler
        worker = self._p.worker
        return readiness(
            sample_age=s.age() if s is not None else None,
            sample_error=s.last_error if s is not None else None,
            schema_version=s.latest.schema_version if s is not None and s.latest else None,
            expected_version=self._p.adapters.schema_version,
            worker=worker.health() if worker is not None else None,
            stale_after=self._stale_after,
        )


class _BoundedGauges:
    """Takes each sample on a lane (processor/runtime/lane.py) and waits a bounded time.

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
