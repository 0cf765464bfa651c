"""The Prometheus metrics of one replica; the names and labels are deploy/METRICS.md's.

Counters are not incremented on the hot path: the collector reads the loops' own tallies
(worker stats, the consumer's rebalances, the relay's counts) when Prometheus scrapes. The
histograms are observed once per batch (or per deadline sweep), and the dead letters and handler
errors of a batch are tallied from its write set once it has committed. Gauges derived from the
database come from the latest :class:`~processor._ports.cluster.DatabaseSample`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, Info, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from processor._engine.rows import WriteSet
from processor._engine.steps import TOO_NEW
from processor._ports.cluster import AGE_BUCKETS, TP, DatabaseSample

__all__ = ["Metrics", "Sources"]

# The planner's reason for a message held behind an already parked saga: not a handler error.
_BEHIND = "behind a parked saga"

_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_RECORDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
_FIRE_LAG = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


@dataclass
class Sources:
    """Where the collector reads the loops' tallies; each is None until that loop exists.

    Attributes:
        worker_stats: The consumer loop's :class:`~processor._runtime.consumer.worker.WorkerStats`.
        rebalances: The consumer's rebalances by kind.
        relay: The relay (``published`` and ``failed_rounds``).
        up: Whether every loop is alive.
    """

    worker_stats: Any = None
    rebalances: Mapping[str, int] | None = None
    relay: Any = None
    # Input records whose key the configured partitioner sends elsewhere, by topic.
    off_partition: Mapping[str, int] | None = None
    stale_producers: Mapping[str, int] | None = None
    # Per saga function type: (resumed in memory, replayed from the journal, held suspended).
    functions: Callable[[], Mapping[str, tuple[int, int, int]]] = dict
    # Schema Registry calls that failed, by the loop that made them (consumer, relay).
    schema_registry: Callable[[], Mapping[str, int]] = dict
    up: Callable[[], bool] = lambda: False


@dataclass
class _Tallies:
    records: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    handler_errors: Counter[str] = field(default_factory=Counter)


class Metrics:
    """The registry one replica serves on /metrics.

    Each replica has its own registry (not prometheus-client's global one), so that several
    processors in one process (tests) keep their numbers apart.
    """

    def __init__(self, replica: str = "-") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.sources = Sources()
        # Memory, CPU, open files and start time of this process (process_* series, on Linux).
        ProcessCollector(registry=self.registry)
        build = Info(
            "saga_build",
            "The replica's name and the package version it runs.",
            registry=self.registry,
        )
        build.info({"version": package_version(), "replica": replica})
        self._lock = threading.Lock()
        self._tallies = _Tallies()
        self._sample: DatabaseSample | None = None
        self._lag: dict[TP, int] = {}
        r = self.registry
        self.batch_size = Histogram(
            "saga_batch_size_records", "Records per committed batch.", buckets=_RECORDS, registry=r
        )
        self.plan_seconds = Histogram(
            "saga_batch_plan_duration_seconds",
            "Time to decode and plan a batch (handlers included).",
            buckets=_SECONDS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "saga_batch_commit_duration_seconds",
            "Time to write and commit a batch's transaction.",
            buckets=_SECONDS,
            registry=r,
        )
        self.fire_lag = Histogram(
            "saga_deadline_fire_lag_seconds",
            "Dispatch time minus due time of each fired deadline.",
            buckets=_FIRE_LAG,
            registry=r,
        )
        r.register(_Collector(self))

    # -- fed by the loops --------------------------------------------------------------------

    def batch(self, records: int, topics: Mapping[str, int], plan: float, commit: float) -> None:
        """One committed batch: its size, per-topic records and timings."""
        self.batch_size.observe(records)
        self.plan_seconds.observe(plan)
        self.commit_seconds.observe(commit)
        with self._lock:
            self._tallies.records.update(topics)

    def committed(self, ws: WriteSet) -> None:
        """Tallies a committed batch's dead letters and failed handlers (usually none)."""
        if not ws.dead_letters and not ws.parked:
            return
        with self._lock:
            for d in ws.dead_letters:
                self._tallies.dead_letters[d.reason] += 1
            for p in ws.parked:
                # Held behind a parked saga, or parked by an event newer than the code: no
                # handler ran, so no handler failed.
                if p.reason != _BEHIND and TOO_NEW not in p.reason:
                    self._tallies.handler_errors[p.saga_type] += 1

    def fired(self, lags: list[float]) -> None:
        """The fire lag of each deadline a sweep dispatched."""
        for lag in lags:
            self.fire_lag.observe(lag)

    def sampled(self, sample: DatabaseSample, high_watermarks: Mapping[TP, int] | None) -> None:
        """The database's latest sample and the partitions' high watermarks.

        High watermarks of None (the broker did not answer) leave the lag as last seen.
        """
        with self._lock:
            self._sample = sample
            if high_watermarks is None:
                return
            self._lag = {
                tp: max(0, high - (sample.stored_offsets.get(tp) or 0))
                for tp, high in high_watermarks.items()
                if tp in sample.stored_offsets
            }

    # -- read by the collector -----------------------------------------------------------------

    def snapshot(self) -> tuple[_Tallies, DatabaseSample | None, dict[TP, int]]:
        """A consistent copy of the tallies, the latest sample and the lag, for one scrape."""
        with self._lock:
            t = self._tallies
            copy = _Tallies(Counter(t.records), Counter(t.dead_letters), Counter(t.handler_errors))
            return copy, self._sample, dict(self._lag)


def package_version() -> str:
    """The installed distribution's version; ``unknown`` when run from a bare checkout."""
    try:
        return metadata.version("saga-processor")
    except metadata.PackageNotFoundError:
        return "unknown"


class _Collector(Collector):
    """Builds the counters and gauges from the tallies at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        m = self._m
        src = m.sources
        tallies, sample, lag = m.snapshot()
        yield _counter(
            "saga_records_consumed",
            "Records read from input topics.",
            ["topic"],
            {(t,): n for t, n in tallies.records.items()},
        )
        stats = src.worker_stats
        yield _counter(
            "saga_batches",
            "Batches committed.",
            [],
            {(): stats.batches if stats is not None else 0},
        )
        yield _counter(
            "saga_ended",
            "Sagas this replica ended, by how they ended (SagaOutcome).",
            ["saga_type", "outcome"],
            dict(stats.outcomes) if stats is not None else {},
        )
        yield _counter(
            "saga_escalations",
            "Sagas this replica handed to a person, by kind: handler (a plain handler's "
            "escalate), step (an orchestrated step) or undo (a failed undo).",
            ["saga_type", "kind"],
            dict(stats.escalations) if stats is not None else {},
        )
        yield _counter(
            "saga_records_for_other_sagas",
            "Replies whose saga-type header names a saga type this processor does not run.",
            ["topic", "saga_type"],
            dict(stats.foreign) if stats is not None else {},
        )
        yield _counter(
            "saga_resyncs",
            "Times the worker re-read its offsets from PostgreSQL.",
            [],
            {(): stats.resyncs if stats is not None else 0},
        )
        yield _counter(
            "saga_batches_outcome_unknown",
            "Batches in doubt whose partitions changed owner before the outcome could be read.",
            [],
            {(): stats.doubts_unresolved if stats is not None else 0},
        )
        rebalances = dict(src.rebalances or {})
        yield _counter(
            "saga_rebalances",
            # "replaced": the Kafka client was replaced, the group having gone on without it.
            "Consumer group rebalances seen by this replica.",
            ["kind"],
            {(k,): rebalances.get(k, 0) for k in ("assigned", "revoked", "lost", "replaced")},
        )
        off = dict(src.off_partition or {})
        yield _counter(
            "saga_records_off_partition",
            "Input records whose key SAGA_CONSUMER__PARTITIONER would send to another partition.",
            ["topic"],
            {(t,): n for t, n in off.items()},
        )
        stale = dict(src.stale_producers or {})
        yield _counter(
            "saga_records_from_stale_producers",
            "Input records sent where a grown topic's old partition count put their key.",
            ["topic"],
            {(t,): n for t, n in stale.items()},
        )
        relay = src.relay
        yield _counter(
            "saga_relay_published",
            "Outbox rows the relay published and deleted.",
            [],
            {(): relay.published if relay is not None else 0},
        )
        failed = dict(relay.failed_rounds) if relay is not None else {}
        yield _counter(
            "saga_relay_failed",
            "Relay rounds that failed (rows stay).",
            ["reason"],
            {(r,): n for r, n in failed.items()},
        )
        yield _counter(
            "saga_schema_registry_failures",
            "Schema Registry calls that failed (unreachable or erroring); the records wait.",
            ["loop"],
            {(loop,): n for loop, n in src.schema_registry().items()},
        )
        yield _counter(
            "saga_dead_letters",
            "Records sent to the dead-letter topic.",
            ["reason"],
            {(r,): n for r, n in tallies.dead_letters.items()},
        )
        yield _counter(
            "saga_handler_errors",
            "Handler invocations that raised.",
            ["saga_type"],
            {(t,): n for t, n in tallies.handler_errors.items()},
        )
        functions = dict(src.functions())
        yield _counter(
            "saga_function_resumes",
            "Saga function runs resumed from the function this replica held suspended.",
            ["saga_type"],
            {(t,): n[0] for t, n in functions.items()},
        )
        yield _counter(
            "saga_function_replays",
            "Saga function runs replayed from the journal (not held here: a rebalance, a "
            "restart, the cache's bound).",
            ["saga_type"],
            {(t,): n[1] for t, n in functions.items()},
        )
        yield _gauge(
            "saga_functions_suspended",
            "Saga functions this replica holds suspended in memory.",
            ["saga_type"],
            {(t,): n[2] for t, n in functions.items()},
        )
        yield _gauge(
            "saga_partitions_waiting_on_growth",
            "Assigned partitions a topic's growth added, waiting for the old ones to drain.",
            [],
            {(): getattr(stats, "growth_waiting", 0)},
        )
        yield _gauge(
            "saga_partitions_waiting_on_node",
            "Assigned partitions whose rows' database node does not answer (tables distributed "
            "by bucket): they wait, the others go on.",
            [],
            {(): getattr(stats, "waiting_on_node", 0)},
        )
        yield _gauge(
            "saga_up",
            "1 while every loop of the replica is alive.",
            [],
            {(): 1.0 if src.up() else 0.0},
        )
        yield _gauge(
            "saga_consumer_lag_records",
            "High watermark minus the stored offset.",
            [
                "topic",
                "partition",
            ],
            {(t, str(p)): n for (t, p), n in lag.items()},
        )
        yield from _sampled(sample)


def _sampled(s: DatabaseSample | None) -> Iterator[Metric]:
    s = s if s is not None else DatabaseSample()
    yield _gauge("saga_outbox_depth_rows", "Rows waiting in the outbox.", [], {(): s.outbox_depth})
    yield _gauge(
        "saga_outbox_oldest_age_seconds",
        "Age of the oldest outbox row.",
        [],
        {(): s.outbox_oldest_age},
    )
    yield _gauge(
        "saga_deadlines_pending",
        "Deadlines scheduled, not yet fired.",
        [],
        {(): s.deadlines_pending},
    )
    yield _gauge(
        "saga_deadlines_overdue",
        "Deadlines due, not dispatched yet.",
        [],
        {(): s.deadlines_overdue},
    )
    yield _gauge(
        "saga_instances",
        "Saga instances by status.",
        ["saga_type", "status"],
        {k: n for k, n in s.instances.items()},
    )
    yield _gauge(
        "saga_parked_sagas",
        "Parked sagas waiting for a retry.",
        ["saga_type"],
        {(t,): n for (t, status), n in s.instances.items() if status == "parked"},
    )
    yield _gauge(
        "saga_machine_states",
        "Sagas by machine state.",
        ["saga_type", "state"],
        {k: n for k, (n, _) in s.machine_states.items()},
    )
    yield _gauge(
        "saga_machine_state_oldest_age_seconds",
        "Time the oldest saga has spent in that machine state.",
        ["saga_type", "state"],
        {k: age for k, (_, age) in s.machine_states.items()},
    )
    ages = GaugeHistogramMetricFamily(
        "saga_state_age_seconds",
        "Sagas not ended by how long they have been in their state (sampled).",
        labels=["saga_type", "state"],
    )
    for key, (cumulative, total) in s.state_ages.items():
        count = s.machine_states.get(key, (0, 0.0))[0]
        buckets = [(_le(b), float(n)) for b, n in zip(AGE_BUCKETS, cumulative, strict=True)]
        ages.add_metric(list(key), [*buckets, ("+Inf", float(count))], total)
    yield ages


def _le(bound: float) -> str:
    return f"{bound:g}"


def _counter(
    name: str, doc: str, labels: list[str], values: Mapping[tuple[str, ...], float]
) -> Metric:
    return _filled(CounterMetricFamily(name, doc, labels=labels), values)


def _gauge(
    name: str, doc: str, labels: list[str], values: Mapping[tuple[str, ...], float]
) -> Metric:
    return _filled(GaugeMetricFamily(name, doc, labels=labels), values)


def _filled(
    family: CounterMetricFamily | GaugeMetricFamily, values: Mapping[tuple[str, ...], float]
) -> Metric:
    for key, value in values.items():
        family.add_metric(list(key), value)
    return family
