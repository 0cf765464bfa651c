"""The consumer loop: one batch per poll, one transaction per batch, offsets stored with effects.

Speaks only to ports: a :class:`~processor._ports.RecordConsumer` for records, and two
:class:`~processor._ports.BatchStore` handles, each used from its own lane (a thread the loop can
stop waiting for): one commits batch N while the other serves rebalance claims, planning reads
and resyncs for batch N+1 (access.py).

Nothing the database does can stall the loop past ``unavailable_timeout``: a failed or unanswered
call leaves the loop polling Kafka (so the group keeps this replica) while it retries with
backoff, and once the database has been unreachable for that long the replica gives its
partitions back to the group and rejoins when the database answers again (recovery.py).
Which partitions are owned, and their claims, are in ownership.py; what is read ahead of
the batches, in intake.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future

from processor._authoring.messages import MessageRegistry
from processor._engine.plan import Planner
from processor._engine.records import Record
from processor._engine.rows import WriteSet
from processor._errors import CommitInDoubt, Failure, RecordDataError, RuntimeFailure
from processor._ports import TP, BatchStore, RecordConsumer
from processor._runtime.consumer.access import StoreLanes
from processor._runtime.consumer.batch import Limits, Owned, Planned
from processor._runtime.consumer.intake import Follow, Intake
from processor._runtime.consumer.lane import Stuck, wait
from processor._runtime.consumer.ownership import Claims, Ownership
from processor._runtime.consumer.placement import PlacementCheck
from processor._runtime.consumer.recovery import Recovery
from processor._runtime.consumer.stats import WorkerStats
from processor._runtime.consumer.steps import BatchDone, BatchObservers, BatchSteps
from processor._runtime.hooks import HookPoint, Hooks
from processor._runtime.schemas import SchemaResolver

__all__ = [
    "Assign",
    "BatchDone",
    "BatchObservers",
    "ConsumerFactory",
    "Follow",
    "Revoke",
    "Worker",
    "WorkerStats",
]

log = logging.getLogger(__name__)

# Seconds between reads of the owned partitions' epochs: a replica fenced by another's claim on
# a partition with no input learns it within this (a commit there would tell it sooner).
FENCE_CHECK = 30.0

Assign = Callable[[list[TP]], Mapping[TP, int | None]]
"""The rebalance callback for assigned partitions: where to start reading each (None: stored)."""
Revoke = Callable[[list[TP]], None]
"""The rebalance callback for revoked partitions."""
ConsumerFactory = Callable[[Assign, Revoke], RecordConsumer]
"""Opens the worker's consumer, given the worker's rebalance callbacks."""


def _nothing() -> None:
    pass


def _ignore(ws: WriteSet) -> None:
    pass


class Worker:
    """Drives one consumer. `poll_once()` is the single step; the processor loops it.

    Args:
        store: The handle batches are committed on.
        control: The handle for claims, planning reads and resyncs.
        planner: Plans each batch.
        registry: Decodes the records.
        owner: This replica's name, stored with its claims.
        consumer: Opens the consumer, given :meth:`on_assign` and :meth:`on_revoke`.
        max_record_bytes: Records larger than this are dead-lettered.
        batch_size: Most records in one batch.
        batch_timeout: Seconds a poll waits for records when none are in hand.
        ownership: The owned partitions, shared with the relay (which reads their epochs);
            a fresh one when None.
        on_commit: Called with each committed batch's writes.
        on_owned: Called after partitions are gained (wakes the relay).
        gate: True for an assigned partition that must not be claimed yet (a topic's growth).
        follow: Holds a grown topic's new partitions' records until what late producers sent
            to the partitions they grew from is applied.
        placement: Counts input records whose key the configured partitioner would send
            elsewhere.
        observers: The metrics and spans of each batch.
        hooks: Named points of a batch ("before-write", "before-commit", "after-commit",
            "revoke") where crash tests inject faults.
        store_factory: Opens a fresh handle to replace one abandoned on a hung call.
        max_batch_bytes: About the most key and value bytes in one batch.
        unavailable_timeout: Seconds the database may fail before the partitions go back.
        clock: The clock of the outage bound and the retries.
        wire: Translates registry-framed records; None: every topic is our JSON.
        colocate: Where a partition's rows live; each batch holds records of one place (see
            :class:`Intake`). None: every partition's rows live together.
    """

    def __init__(
        self,
        *,
        store: BatchStore,
        control: BatchStore,
        planner: Planner,
        registry: MessageRegistry,
        owner: str,
        consumer: ConsumerFactory,
        max_record_bytes: int,
        batch_size: int,
        batch_timeout: float,
        ownership: Ownership | None = None,
        on_commit: Callable[[WriteSet], None] = _ignore,
        on_owned: Callable[[], None] = _nothing,
        gate: Callable[[TP], bool] | None = None,
        follow: Follow | None = None,
        placement: PlacementCheck | None = None,
        observers: BatchObservers | None = None,
        hooks: Hooks | None = None,
        store_factory: Callable[[], BatchStore] | None = None,
        max_batch_bytes: int = 16 * 1024 * 1024,
        unavailable_timeout: float = 20.0,
        clock: Callable[[], float] = time.monotonic,
        wire: SchemaResolver | None = None,
        colocate: Callable[[TP], object] | None = None,
    ) -> None:
        self.planner = planner
        self.registry = registry
        self.owner = owner
        self.limits = Limits(
            batch_size=batch_size,
            batch_timeout=batch_timeout,
            max_batch_bytes=max_batch_bytes,
            max_record_bytes=max_record_bytes,
            unavailable_timeout=unavailable_timeout,
        )
        self.on_commit = on_commit
        self.placement = placement
        self.hooks = hooks or Hooks()
        self.stats = WorkerStats()
        observers = observers or BatchObservers()
        self._on_batch = observers.on_batch
        self._ownership = ownership if ownership is not None else Ownership()
        self._lanes = StoreLanes(
            store, control, store_factory=store_factory, limits=self.limits, clock=clock
        )
        self._claims = Claims(
            self._ownership,
            self._lanes,
            owner=owner,
            gate=gate,
            on_owned=on_owned,
            clock=clock,
            place=colocate,
        )
        self._steps = BatchSteps(
            planner,
            registry,
            self._ownership,
            self._lanes,
            self.limits,
            self.stats,
            hooks=self.hooks,
            placement=placement,
            tracing=observers.tracing,
            wire=wire,
        )
        # The callbacks are called from the consumer's polls, never while it is being opened.
        self.consumer = consumer(self.on_assign, self.on_revoke)
        self._intake = Intake(
            self.consumer,
            self._ownership,
            self.limits,
            self.stats,
            follow=follow,
            clock=clock,
            colocate=colocate,
        )
        self._recovery = Recovery(
            self._lanes,
            self._ownership,
            self._intake,
            self.consumer,
            steps=self._steps,
            limits=self.limits,
            stats=self.stats,
            on_committed=self._committed,
            clock=clock,
        )
        self._clock = clock
        # Batch N commits on the write lane while batch N+1 is read and planned.
        self._pending: tuple[Planned, Future[None]] | None = None
        # When the batch in flight was handed to the write lane (the worker's clock).
        self._submitted_at = 0.0
        self._submitted_mono = 0.0
        # When the owned partitions' epochs are read next (Recovery.check_fences).
        self._next_fence_check = clock() + FENCE_CHECK

    # -- what others read --------------------------------------------------------------------

    @property
    def store(self) -> BatchStore:
        """The handle batches are committed on (replaced when a hung commit is abandoned)."""
        return self._lanes.store

    @property
    def control(self) -> BatchStore:
        """The handle for claims, planning reads and resyncs (replaced like :attr:`store`)."""
        return self._lanes.control

    @property
    def owned(self) -> Mapping[TP, Owned]:
        """The owned partitions, with their epochs and next offsets."""
        return self._ownership.owned

    @property
    def epochs(self) -> Mapping[TP, int]:
        """The owned partitions' epochs; replaced whole on every change, never changed."""
        return self._ownership.epochs

    @property
    def detached(self) -> bool:
        """Whether the partitions were given back because the database stayed away."""
        return self._recovery.detached

    @property
    def batch_size(self) -> int:
        return self.limits.batch_size

    @property
    def carried(self) -> list[Record]:
        """Records read beyond the last batch's byte bound, first in line for the next."""
        return self._intake.carry

    def health(self) -> dict[str, object]:
        """What this worker would tell a health probe."""
        return {
            "detached": self._recovery.detached,
            "unsynced": self._recovery.unsynced,
            "owned": len(self._ownership.owned),
            "unclaimed": len(self._ownership.unclaimed),
            "unavailable_for": self._lanes.availability.down_for(),
            "waiting_on_node": self.stats.waiting_on_node,
        }

    # -- rebalance callbacks (run inside consume(), on the consuming thread) --------------------

    def on_assign(self, tps: list[TP]) -> Mapping[TP, int | None]:
        """Claims newly assigned partitions; those not claimable yet stay paused."""
        claimed = self._claims.assigned(tps)
        self._intake.claimed(claimed)
        return {tp: nxt for tp, (_, nxt) in claimed.items()}

    def on_revoke(self, tps: list[TP]) -> None:
        """Forgets revoked partitions.

        A batch of these partitions still committing is safe: the new owner's claim bumps the
        epoch, so whichever of the two commits comes second is rejected.
        """
        self.hooks.fire(HookPoint.REVOKE)
        gone = set(tps)
        self._ownership.revoked(gone)
        self._intake.revoked(gone)
        log.info("revoked %s", sorted(tps))

    # -- the loop ----------------------------------------------------------------------------

    def poll_once(self) -> int:
        """One step: read and plan batch N+1 while batch N commits on the write lane.

        Planning N+1 needs N's effects before they are committed: the rows it loads are overlaid
        with N's writes, and its offsets and saga versions expect N's. Every write is still a
        compare-and-set, so if N does not commit, N+1 cannot either: it is dropped here and the
        positions are reset to what the store holds.
        """
        consumer = self.consumer
        ownership = self._ownership
        recovery = self._recovery
        availability = self._lanes.availability
        self.stats.last_step = time.monotonic()
        self.stats.claims_on_node = len(ownership.on_node)
        if recovery.detached:
            return recovery.step_detached()
        if ownership.to_pause:
            consumer.pause(sorted(ownership.to_pause))
            ownership.to_pause.clear()
        if (recovery.unsynced or ownership.unclaimed) and availability.may_try():
            if recovery.unsynced:
                recovery.resync()
            if ownership.unclaimed and not recovery.unsynced and self._claims.due():
                claimed = self._claims.claim()
                self._intake.claimed(claimed)
                for tp, (_, nxt) in claimed.items():
                    consumer.seek(tp, nxt)
                    consumer.resume([tp])
        if ownership.unclaimed:
            # Partitions that cannot be claimed are held from the group as much as failing
            # batches are: the same bound gives them back.
            recovery.give_back_if_unavailable()
            if recovery.detached:
                return 0
        if recovery.away and not recovery.unsynced and availability.may_try():
            recovery.bring_back()
        if recovery.unsynced:
            # Keep polling, so the group keeps this replica while the store is away; what is
            # read now is read again from the stored positions once they can be read.
            consumer.consume(self.limits.batch_size, self.limits.batch_timeout)
            recovery.give_back_if_unavailable()
            return 0
        if self._clock() >= self._next_fence_check:
            self._next_fence_check = self._clock() + FENCE_CHECK
            if not self.settle():
                # Rolled back or in doubt: nothing more until the positions are read back.
                recovery.give_back_if_unavailable()
                return 0
            recovery.check_fences()
        records = self._intake.take()
        planned: Planned | None = None
        try:
            batch = self._intake.advance_ends(self._steps.prepare(records))
            # An operator's replay needs the records held behind its saga as stored, with
            # their row ids (to release them), those the batch in flight holds included: planned
            # on top of that batch, it would find none of them and unpark the saga without
            # replaying what was held. A reset reads the saga's history as stored, likewise.
            # Such a batch waits for the one in flight.
            replay = batch is not None and bool(batch.wants.held_keys or batch.wants.history_keys)
            if replay and self._pending is not None and not self.settle():
                recovery.give_back_if_unavailable()
                return len(records)
            if batch is not None:
                prior = self._pending[0].ws if self._pending is not None else None
                planned = self._steps.plan(batch, prior)
        except RuntimeFailure as e:
            if e.kind is not Failure.RETRYABLE:
                raise
            settled = self.settle()
            tps = {(r.topic, r.partition) for r in records}
            if settled and recovery.set_aside(tps, e, "could not plan a batch"):
                recovery.resync()
                return len(records)
            log.warning("could not plan a batch (%s); resyncing", e)
            availability.failed()
            if settled:
                recovery.resync()
            recovery.give_back_if_unavailable()
            return len(records)
        if not self.settle():
            recovery.give_back_if_unavailable()
            return len(records)
        if planned is not None:
            self._pending = (planned, self._lanes.submit_write(lambda: self._steps.write(planned)))
            self._submitted_at = self._clock()
            self._submitted_mono = time.monotonic()
            self._steps.advance(planned.batch)
        return len(records)

    def settle(self) -> bool:
        """Waits for the batch in flight; False when it was rolled back and positions resynced."""
        if self._pending is None:
            return True
        planned, future = self._pending
        self._pending = None
        # Bounded from the submission: a replica that met a silent database while planning
        # the next batch has waited for it already.
        budget = self.limits.unavailable_timeout - (time.monotonic() - self._submitted_mono)
        try:
            wait(future, max(0.0, budget), what="batch commit")
        except Stuck as e:
            self._recovery.hung(planned, e, since=self._submitted_at)
            return False
        except CommitInDoubt as e:
            self._recovery.in_doubt(planned, e)
            return False
        except RecordDataError as e:
            log.warning(
                "batch of %d records refused by the database (%s); finding the records",
                planned.batch.size,
                e,
            )
            return self._recovery.isolate(planned.batch)
        except RuntimeFailure as e:
            if e.kind is Failure.FATAL:
                raise
            self._recovery.rejected(planned, e)
            return False
        self._committed(planned)
        return True

    def resync(self) -> bool:
        """Drops what was read ahead and reads the positions back from the store."""
        return self._recovery.resync()

    def close(self) -> None:
        """Lets the batch in flight finish (commit or roll back), then stops the lanes."""
        self.settle()
        self._lanes.close()

    # -- one batch -----------------------------------------------------------------------------

    def _committed(self, planned: Planned) -> None:
        self._lanes.availability.succeeded()
        self._recovery.writes_failing = False
        self.stats.batches += 1
        self.stats.records += planned.batch.size
        self.stats.counts.update(planned.ws.counts)
        if planned.ws.outcomes:
            # A new Counter, not an update in place: the metrics thread reads it meanwhile.
            self.stats.outcomes = self.stats.outcomes + planned.ws.outcomes
        if planned.ws.escalations:
            self.stats.escalations = self.stats.escalations + planned.ws.escalations
        if planned.batch.foreign:
            self.stats.foreign = self.stats.foreign + planned.batch.foreign
        if self._on_batch is not None:
            self._on_batch(self._steps.done(planned), planned.ws)
        self.on_commit(planned.ws)
        self.consumer.commit_advisory(planned.batch.last)
