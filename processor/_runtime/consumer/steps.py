"""How one batch is made: records decoded, rows loaded and planned, writes committed.

The worker (worker.py) decides when each step runs and on which thread; these are the
steps themselves. The making of a batch is the planner's one recipe (``Planner.prepare`` and
``Planner.apply``); what is added here is the runtime's: the owned partitions and their
offsets, the store lanes, the hooks, the spans.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from processor._authoring.messages import MessageRegistry
from processor._engine.decode import Decoded, decode
from processor._engine.plan import Planner
from processor._engine.records import Record
from processor._engine.rows import SagaKey, WriteSet
from processor._observe.tracing import MAX_LINKS, Tracing, trace_headers
from processor._ports import TP
from processor._runtime.consumer.access import StoreLanes
from processor._runtime.consumer.batch import Batch, Limits, Owned, Planned
from processor._runtime.consumer.ownership import Ownership
from processor._runtime.consumer.placement import PlacementCheck
from processor._runtime.consumer.stats import WorkerStats
from processor._runtime.hooks import HookPoint, Hooks
from processor._runtime.schemas import SchemaResolver


@dataclass(frozen=True, slots=True)
class BatchDone:
    """A committed batch, as the metrics see it (one call per batch, never per record).

    Attributes:
        records: Records in the batch.
        topics: Records per input topic.
        plan_seconds: Time to load its rows and plan it, handlers included.
        commit_seconds: Time to write and commit its transaction.
    """

    records: int
    topics: Mapping[str, int]
    plan_seconds: float
    commit_seconds: float


@dataclass(frozen=True, slots=True)
class BatchObservers:
    """What watches the batches: the metrics and the spans (_runtime/observe.py).

    Attributes:
        on_batch: Called once per committed batch with its size and timings.
        tracing: Spans for batches and commits when OpenTelemetry is configured.
    """

    on_batch: Callable[[BatchDone, WriteSet], None] | None = None
    tracing: Tracing | None = None


class BatchSteps:
    """Decodes, plans and writes batches of the owned partitions.

    Args:
        planner: Plans each batch.
        registry: Decodes the records.
        ownership: The owned partitions and where each batch starts.
        lanes: The stores and their lanes.
        limits: Shared bounds (the record size among them).
        stats: Where the last commit's duration is kept.
        hooks: Fault points ("before-write", "before-commit", "after-commit").
        placement: Counts input records whose key the partitioner would send elsewhere.
        tracing: Spans for batches and commits; None: no spans.
        wire: Translates registry-framed records; None: every topic is our JSON.
    """

    def __init__(
        self,
        planner: Planner,
        registry: MessageRegistry,
        ownership: Ownership,
        lanes: StoreLanes,
        limits: Limits,
        stats: WorkerStats,
        *,
        hooks: Hooks,
        placement: PlacementCheck | None,
        tracing: Tracing | None,
        wire: SchemaResolver | None = None,
    ) -> None:
        self._planner = planner
        self._resolver = wire
        self._wire = wire.wire if wire is not None else None
        self._registry = registry
        self._ownership = ownership
        self._lanes = lanes
        self._limits = limits
        self._stats = stats
        self._hooks = hooks
        self._placement = placement
        self._tracing = tracing

    def prepare(self, records: list[Record]) -> Batch | None:
        """The batch of ``records`` not yet applied of the owned partitions; None if none."""
        # Positions are those the batch in flight (if any) will leave behind: see advance.
        owned = self._ownership.owned
        wire = self._wire
        if self._resolver is not None:
            # Raises Retryable while the registry is away: the batch is read again later.
            self._resolver.prepare_in(records)
        mine = [
            decode(r, self._registry, self._limits.max_record_bytes, wire)
            for r in records
            if (o := owned.get((r.topic, r.partition))) is not None
            and (o.next_offset is None or r.offset >= o.next_offset)
        ]
        if not mine:
            return None
        if self._placement is not None:
            # Operator records off their saga's partition come back rejected.
            mine = self._placement.check(mine)
        return self.batch(mine, self._ownership.owned)

    def batch(self, decoded: Sequence[Decoded], owned: Mapping[TP, Owned]) -> Batch:
        """``decoded`` prepared by the planner, its offsets expected at the ``owned`` positions."""
        return Batch.of(self._planner.prepare(decoded), owned)

    def sagas_of(self, decoded: Sequence[Decoded]) -> set[SagaKey]:
        """The sagas ``decoded`` goes to."""
        return self._planner.prepare(decoded).sagas()

    def apply(
        self,
        batch: Batch,
        *,
        prior: WriteSet | None = None,
        park: Mapping[SagaKey, str] | None = None,
    ) -> WriteSet:
        """Loads the batch's rows (a short read on the control lane) and plans it over them.

        Args:
            batch: The batch.
            prior: The batch still committing: this one is planned as if it had committed.
            park: Sagas to park at their first record instead of running them.
        """
        lanes = self._lanes
        loaded = lanes.on_control(lambda: lanes.control.load(batch.wants), "load")
        return self._planner.apply(batch.prepared, loaded, prior=prior, park=park)

    def plan(self, batch: Batch, prior: WriteSet | None) -> Planned:
        """Loads the batch's rows (a short read on the control lane) and plans it."""
        if self._tracing is not None:
            links = [trace_headers(d.record.headers) for d in batch.decoded[:MAX_LINKS]]
            with self._tracing.span("saga.batch", links=links, attributes={"records": batch.size}):
                return self._plan_now(batch, prior)
        return self._plan_now(batch, prior)

    def _plan_now(self, batch: Batch, prior: WriteSet | None) -> Planned:
        started = time.perf_counter()
        ws = self.apply(batch, prior=prior)
        self._hooks.fire(HookPoint.BEFORE_WRITE)
        return Planned(batch, ws, time.perf_counter() - started)

    def write(self, planned: Planned) -> None:
        """Writes and commits one planned batch; runs on the write lane."""
        if self._tracing is not None:
            with self._tracing.span("saga.commit", attributes={"records": planned.batch.size}):
                self._write_now(planned)
        else:
            self._write_now(planned)

    def _write_now(self, planned: Planned) -> None:
        started = time.perf_counter()
        self._lanes.store.write(
            planned.ws,
            planned.batch.offsets,
            before_commit=lambda: self._hooks.fire(HookPoint.BEFORE_COMMIT),
        )
        self._stats.last_commit_seconds = time.perf_counter() - started
        self._hooks.fire(HookPoint.AFTER_COMMIT)

    def advance(self, batch: Batch) -> None:
        """Moves the positions past ``batch`` as if it commits; a resync undoes it if not."""
        owned = self._ownership.owned
        for commit in batch.offsets:
            o = owned.get((commit.topic, commit.partition))
            if o is not None and o.epoch == commit.epoch:
                o.next_offset = commit.next_offset

    def done(self, planned: Planned) -> BatchDone:
        """The committed batch as the metrics see it."""
        batch = planned.batch
        topics = {t for t, _ in batch.last}
        if len(topics) == 1:
            per_topic: Mapping[str, int] = {topics.pop(): batch.size}
        else:
            per_topic = Counter(d.record.topic for d in batch.decoded)
        return BatchDone(
            batch.size, per_topic, planned.plan_seconds, self._stats.last_commit_seconds
        )
