"""The consumer loop: one batch per poll, one transaction per batch, offsets stored with effects.

Speaks only to ports: a :class:`~processor.ports.RecordConsumer` for records, and two
:class:`~processor.ports.BatchStore` handles, each used from its own lane (a thread the loop can
stop waiting for): one commits batch N while the other serves rebalance claims, planning reads
and resyncs for batch N+1.

Nothing the database does can stall the loop past ``unavailable_timeout``: a failed or unanswered
call leaves the loop polling Kafka (so the group keeps this replica) while it retries with
backoff, and once the database has been unreachable for that long the replica gives its
partitions back to the group and rejoins when the database answers again.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from processor.engine.decode import Decoded, Operator, Rejected, decode
from processor.engine.overlay import overlay
from processor.engine.plan import Planner
from processor.engine.records import Record
from processor.engine.rows import SagaKey, WriteSet
from processor.errors import CommitInDoubt, Failure, LockBusy, RecordDataError, RuntimeFailure
from processor.messages import MessageRegistry
from processor.observe.tracing import MAX_LINKS, Tracing, trace_headers
from processor.ports import TP, BatchStore, RecordConsumer
from processor.runtime.availability import Availability
from processor.runtime.batch import Batch, Owned, Planned
from processor.runtime.hooks import Hooks
from processor.runtime.isolate import isolate_refused
from processor.runtime.lane import Lane, Stuck, wait
from processor.runtime.placement import PlacementCheck

log = logging.getLogger(__name__)
_T = TypeVar("_T")
# Seconds between tries to claim partitions whose rows another session holds.
CLAIM_RETRY = 1.0
# A grown topic's new partition whose oldest waiting record has waited this long counts as
# waiting on its growth (the gauge and its alert): the partitions it follows are not consumed.
FOLLOW_SLOW = 30.0


class Follow(Protocol):
    """When records of a grown topic's new partitions may be applied (runtime/growth.py)."""

    def ancestors(self, tp: TP) -> tuple[int, ...]:
        """The partitions a late producer may send ``tp``'s keys to instead; empty if none."""
        ...

    def cleared(self, tp: TP) -> float:
        """Records of ``tp`` read at or before this time (the worker's clock) may be applied."""
        ...

    def want(self, tp: TP) -> None:
        """Asks that records of ``tp`` read up to now be cleared."""
        ...


@dataclass
class WorkerStats:
    batches: int = 0
    records: int = 0
    rejected_batches: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    # Sagas ended, by (saga type, outcome).
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    # Replies addressed to saga types this processor does not run, by (topic, saga type).
    foreign: Counter[tuple[str, str]] = field(default_factory=Counter)
    # Times the positions were read back from the store (fenced, failed or in-doubt commit).
    resyncs: int = 0
    # time.monotonic() at the start of the last poll: the liveness probe's heartbeat.
    last_step: float = field(default_factory=time.monotonic)
    # Seconds the last batch's write and commit took (set on the write lane, read after it).
    last_commit_seconds: float = 0.0
    # Assigned partitions waiting, unclaimed, for their topic's new count (runtime/growth.py),
    # plus new partitions whose records have waited FOLLOW_SLOW for the ones they follow.
    growth_waiting: int = 0


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


class Worker:
    """Drives one consumer. `poll_once()` is the single step; the processor loops it."""

    def __init__(
        self,
        *,
        store: BatchStore,
        control: BatchStore,
        planner: Planner,
        registry: MessageRegistry,
        owner: str,
        max_record_bytes: int,
        batch_size: int,
        batch_timeout: float,
        on_commit: Callable[[WriteSet], None] = lambda ws: None,
        hooks: Hooks | None = None,
        store_factory: Callable[[], BatchStore] | None = None,
        max_batch_bytes: int = 16 * 1024 * 1024,
        unavailable_timeout: float = 20.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.control = control
        self.planner = planner
        self.registry = registry
        self.owner = owner
        self.max_record_bytes = max_record_bytes
        self.batch_size = batch_size
        self.batch_timeout = batch_timeout
        self.max_batch_bytes = max_batch_bytes
        self.unavailable_timeout = unavailable_timeout
        self.on_commit = on_commit
        # Called once per committed batch with its size and timings (the metrics).
        self.on_batch: Callable[[BatchDone, WriteSet], None] | None = None
        # Spans for batches and commits when OpenTelemetry is configured (observe/tracing.py).
        self.tracing: Tracing | None = None
        # True for an assigned partition that must not be claimed yet (a topic's growth).
        self.gate: Callable[[TP], bool] | None = None
        # Holds a grown topic's new partitions' records until what late producers sent to the
        # partitions they grew from is applied.
        self.follow: Follow | None = None
        # Counts input records whose key the configured partitioner would send elsewhere.
        self.placement: PlacementCheck | None = None
        # Named points of a batch ("before-write", "before-commit", "after-commit") where crash
        # tests inject faults.
        self.hooks = hooks or Hooks()
        self.owned: dict[TP, Owned] = {}
        # The owned partitions' epochs, replaced whole on every change: other threads (the
        # relay) read it without a lock. on_owned is called after each gain (wakes the relay).
        self.epochs: Mapping[TP, int] = {}
        self.on_owned: Callable[[], None] = lambda: None
        self.stats = WorkerStats()
        self.consumer: RecordConsumer | None = None
        self._store_factory = store_factory
        # Batch N commits on the write lane while batch N+1 is read and planned.
        self._write_lane = Lane("batch-writer")
        self._control_lane = Lane("batch-control")
        self._pending: tuple[Planned, Future[None]] | None = None
        # Assigned by the group but not yet claimed in the store: paused until claimed.
        self._unclaimed: set[TP] = set()
        self._to_pause: set[TP] = set()
        # Records read beyond the batch's byte bound, first in line for the next batch.
        self._carry: list[Record] = []
        # Records of new partitions waiting on the partitions they follow, with when each was
        # read; a partition with any waits whole, in order, and is paused once it holds a batch.
        self._deferred: dict[TP, list[tuple[float, Record]]] = {}
        self._follow_paused: set[TP] = set()
        # Partitions read to their end, and the position there (past transaction markers).
        self._ends: dict[TP, int] = {}
        # Held partitions, and new partitions whose records have waited FOLLOW_SLOW.
        self._held_count = 0
        self._slow = 0
        # Positions must be read back from the store before the next batch.
        self._unsynced = False
        # A batch whose commit outcome is unknown until the stored offsets can be read.
        self._doubt: Planned | None = None
        # The last commit failed or hung, and none has succeeded since.
        self._writes_failing = False
        # When the batch in flight was handed to the write lane (the worker's clock).
        self._submitted_at = 0.0
        self._submitted_mono = 0.0
        self._availability = Availability(clock)
        self._clock = clock
        # No claim retry before this time: the partitions' rows were busy.
        self._claim_after = 0.0
        self._polled_at = 0.0
        self.detached = False

    # -- rebalance callbacks (run inside consume(), on the consuming thread) --------------------

    def on_assign(self, tps: list[TP]) -> Mapping[TP, int | None]:
        """Claims newly assigned partitions; those not claimable yet stay paused."""
        self._unclaimed.update(tps)
        claimed = self._claim()
        # Paused right after this callback returns (the client assigns them on return).
        self._to_pause.update(tp for tp in tps if tp not in claimed)
        return {tp: nxt for tp, (_, nxt) in claimed.items()}

    def on_revoke(self, tps: list[TP]) -> None:
        """Forgets revoked partitions.

        A batch of these partitions still committing is safe: the new owner's claim bumps the
        epoch, so whichever of the two commits comes second is rejected.
        """
        self.hooks.fire("revoke")
        gone = set(tps)
        for tp in gone:
            self.owned.pop(tp, None)
        self._publish_owned()
        self._unclaimed -= gone
        self._held_count = min(self._held_count, len(self._unclaimed))
        self._to_pause -= gone
        self._carry = [r for r in self._carry if (r.topic, r.partition) not in gone]
        for tp in gone:
            self._deferred.pop(tp, None)
            self._ends.pop(tp, None)
        self._follow_paused -= gone
        log.info("revoked %s", sorted(tps))

    def _claim(self) -> dict[TP, tuple[int, int | None]]:
        # Partitions a topic's growth added wait, unclaimed and paused, until the old partitions
        # their sagas came from are consumed far enough (processor/runtime/growth.py).
        gate = self.gate
        tps = sorted(tp for tp in self._unclaimed if gate is None or not gate(tp))
        self._held_count = len(self._unclaimed) - len(tps)
        if not tps:
            return {}
        try:
            claimed = self._control(lambda: self.control.claim(tps, self.owner), "claim")
        except LockBusy as e:
            # The previous owner's relay is still publishing these partitions' outbox rows (or
            # its batch is committing): the database answers, so this is no outage. Try again
            # shortly, without holding up the loop on every poll meanwhile.
            self._claim_after = self._clock() + CLAIM_RETRY
            log.info("partitions %s still busy (%s); they wait, paused", tps, e)
            return {}
        except RuntimeFailure as e:
            if e.kind is Failure.FATAL:
                raise
            # A frozen previous owner may hold these rows until the server ends its idle
            # transaction, or the database is down: keep them paused and try again later
            # rather than fail the rebalance and leave them to yet another replica. Back off, so
            # an outage costs a few tries (and log lines) a second rather than one per poll.
            self._availability.failed(back_off=True)
            log.warning("could not claim %s yet (%s); they wait, paused", tps, e)
            return {}
        self._availability.succeeded()
        for tp, (epoch, nxt) in claimed.items():
            self.owned[tp] = Owned(epoch, nxt)
            self._unclaimed.discard(tp)
            self._ends.pop(tp, None)
        self._publish_owned()
        if claimed:
            # Relaying moves with the partition: its rows are ours to publish now.
            self.on_owned()
        log.info("assigned %s", sorted(claimed))
        return claimed

    def _publish_owned(self) -> None:
        self.epochs = {tp: o.epoch for tp, o in self.owned.items()}

    # -- the loop ----------------------------------------------------------------------------

    def poll_once(self) -> int:
        """One step: read and plan batch N+1 while batch N commits on the write lane.

        Planning N+1 needs N's effects before they are committed: the rows it loads are overlaid
        with N's writes, and its offsets and saga versions expect N's. Every write is still a
        compare-and-set, so if N does not commit, N+1 cannot either: it is dropped here and the
        positions are reset to what the store holds.
        """
        consumer = self.consumer
        assert consumer is not None
        self.stats.last_step = time.monotonic()
        if self.detached:
            return self._step_detached(consumer)
        if self._to_pause:
            consumer.pause(sorted(self._to_pause))
            self._to_pause.clear()
        if (self._unsynced or self._unclaimed) and self._availability.may_try():
            if self._unsynced:
                self._resync()
            if self._unclaimed and not self._unsynced and self._clock() >= self._claim_after:
                for tp, (_, nxt) in self._claim().items():
                    consumer.seek(tp, nxt)
                    consumer.resume([tp])
        if self._unclaimed:
            # Partitions that cannot be claimed are held from the group as much as failing
            # batches are: the same bound gives them back.
            self._give_back_if_unavailable()
            if self.detached:
                return 0
        if self._unsynced:
            # Keep polling, so the group keeps this replica while the store is away; what is
            # read now is read again from the stored positions once they can be read.
            consumer.consume(self.batch_size, self.batch_timeout)
            self._give_back_if_unavailable()
            return 0
        records = self._take(consumer)
        planned: Planned | None = None
        try:
            batch = self._advance_ends(self._prepare(records))
            # An operator's replay needs the records held behind its saga as stored, with
            # their row ids (to release them), those the batch in flight holds included: planned
            # on top of that batch, it would find none of them and unpark the saga without
            # replaying what was held. Such a batch waits for the one in flight.
            replay = batch is not None and bool(batch.wants.held_keys)
            if replay and self._pending is not None and not self.settle():
                self._give_back_if_unavailable()
                return len(records)
            if batch is not None:
                prior = self._pending[0].ws if self._pending is not None else None
                planned = self._plan(batch, prior)
        except RuntimeFailure as e:
            if e.kind is not Failure.RETRYABLE:
                raise
            log.warning("could not plan a batch (%s); resyncing", e)
            self._availability.failed()
            if self.settle():
                self._resync()
            self._give_back_if_unavailable()
            return len(records)
        if not self.settle():
            self._give_back_if_unavailable()
            return len(records)
        if planned is not None:
            self._pending = (planned, self._write_lane.submit(lambda: self._write(planned)))
            self._submitted_at = self._clock()
            self._submitted_mono = time.monotonic()
            self._advance(planned.batch)
        return len(records)

    def settle(self) -> bool:
        """Waits for the batch in flight; False when it was rolled back and positions resynced."""
        if self._pending is None:
            return True
        planned, future = self._pending
        self._pending = None
        size = planned.batch.size
        # Bounded from the submission: a replica that met a silent database while planning
        # the next batch has waited for it already.
        budget = self.unavailable_timeout - (time.monotonic() - self._submitted_mono)
        try:
            wait(future, max(0.0, budget), what="batch commit")
        except Stuck as e:
            self._abandon_write_lane()
            # The commit has hung since it was submitted: the outage began then.
            self._availability.failed(since=self._submitted_at)
            self._in_doubt(planned, e)
            return False
        except CommitInDoubt as e:
            self._in_doubt(planned, e)
            return False
        except RecordDataError as e:
            log.warning(
                "batch of %d records refused by the database (%s); finding the records", size, e
            )
            return self._isolate(planned.batch)
        except RuntimeFailure as e:
            if e.kind is Failure.FATAL:
                raise
            self.stats.rejected_batches += 1
            if e.kind is Failure.FENCED:
                log.warning("batch of %d records not committed: fenced (%s); resyncing", size, e)
            else:
                self._availability.failed()
                self._writes_failing = True
                log.warning("batch of %d records not committed (%s); resyncing", size, e)
            self._resync()
            return False
        self._committed(planned)
        return True

    def health(self) -> dict[str, object]:
        """What this worker would tell a health probe."""
        return {
            "detached": self.detached,
            "unsynced": self._unsynced,
            "owned": len(self.owned),
            "unclaimed": len(self._unclaimed),
            "unavailable_for": self._availability.down_for(),
        }

    def close(self) -> None:
        """Lets the batch in flight finish (commit or roll back), then stops the lanes."""
        self.settle()
        self._write_lane.close()
        self._control_lane.close()

    # -- one batch -----------------------------------------------------------------------------

    def _take(self, consumer: RecordConsumer) -> list[Record]:
        """Up to batch-size records and about max-batch-bytes, carried-over ones first.

        Then records of new partitions that were cleared while they waited, then what the
        consumer reads now, less the records of new partitions that must wait.
        """
        records, self._carry = self._carry, []
        self._slow = 0
        if self._deferred:
            records.extend(self._release(self.batch_size - len(records)))
        self.stats.growth_waiting = self._held_count + self._slow
        room = self.batch_size - len(records)
        if room > 0:
            wait = 0.0 if records or self._deferred else self.batch_timeout
            fresh = consumer.consume(room, wait)
            records.extend(self._defer(fresh) if self.follow is not None else fresh)
        self._note_ends(consumer)
        size = 0
        for i, r in enumerate(records):
            size += len(r.value or b"") + len(r.key or b"")
            if size > self.max_batch_bytes and i > 0:
                self._carry = records[i:]
                return records[:i]
        return records

    def _defer(self, fresh: list[Record]) -> list[Record]:
        """``fresh`` less the records of new partitions that must wait, which are kept."""
        follow = self.follow
        assert follow is not None
        read_at = self._clock()
        waits: dict[TP, bool] = {}
        out: list[Record] = []
        for r in fresh:
            tp = (r.topic, r.partition)
            queue = self._deferred.get(tp)
            if queue is None:
                must = waits.get(tp)
                if must is None:
                    must = waits[tp] = (
                        tp in self.owned
                        and bool(follow.ancestors(tp))
                        and follow.cleared(tp) < read_at
                    )
                if not must:
                    out.append(r)
                    continue
                queue = self._deferred[tp] = []
            queue.append((read_at, r))
        full = []
        for tp, queue in self._deferred.items():
            follow.want(tp)
            if len(queue) >= self.batch_size and tp not in self._follow_paused:
                full.append(tp)
        if full and self.consumer is not None:
            # Bounded memory: a partition that holds a batch's worth reads no more until then.
            self.consumer.pause(full)
            self._follow_paused.update(full)
        return out

    def _release(self, room: int) -> list[Record]:
        """Up to ``room`` waiting records that were cleared, each partition's in order."""
        follow = self.follow
        assert follow is not None
        out: list[Record] = []
        slow = 0
        now = self._clock()
        for tp in list(self._deferred):
            queue = self._deferred[tp]
            cleared = follow.cleared(tp)
            n = 0
            while n < len(queue) and n < room - len(out) and queue[n][0] <= cleared:
                n += 1
            out.extend(r for _, r in queue[:n])
            del queue[:n]
            if queue:
                follow.want(tp)
                slow += now - queue[0][0] >= FOLLOW_SLOW
                continue
            del self._deferred[tp]
            if tp in self._follow_paused:
                self._follow_paused.discard(tp)
                if self.consumer is not None:
                    self.consumer.resume([tp])
        self._slow = slow
        return out

    def _note_ends(self, consumer: RecordConsumer) -> None:
        """Keeps where partitions were read to their end, for :meth:`_advance_ends`."""
        for tp, position in consumer.ends().items():
            if tp in self.owned:
                self._ends[tp] = position

    def _advance_ends(self, batch: Batch | None) -> Batch | None:
        """``batch`` (or a batch of no records) storing positions past trailing markers.

        A partition read to its end whose last records were transaction markers (or aborted
        records) is stored at its end, not after its last record: a new partition that follows
        it waits for its stored position to reach its high watermark, which no record reaches.
        Only when every record read before the end is applied: none waits, none is carried.
        """
        if not self._ends:
            return batch
        busy = {tp for tp in self._deferred}
        busy.update((r.topic, r.partition) for r in self._carry)
        if batch is not None:
            busy.update(batch.last)
        advances: dict[TP, int] = {}
        for tp, end in list(self._ends.items()):
            if tp in busy:
                continue
            owned = self.owned.get(tp)
            if owned is None or owned.next_offset is None or owned.next_offset >= end:
                del self._ends[tp]
                continue
            advances[tp] = end
            del self._ends[tp]
        if not advances:
            return batch
        if batch is None:
            return Batch.of([], self.planner, self.owned, advances)
        return batch.advancing(advances, self.owned)

    def _prepare(self, records: list[Record]) -> Batch | None:
        # Positions are those the batch in flight (if any) will leave behind: see _advance.
        mine = [
            decode(r, self.registry, self.max_record_bytes)
            for r in records
            if (o := self.owned.get((r.topic, r.partition))) is not None
            and (o.next_offset is None or r.offset >= o.next_offset)
        ]
        if not mine:
            return None
        if self.placement is not None:
            self.placement.check(mine)
        return self._batch(mine)

    def _batch(self, decoded: list[Decoded]) -> Batch:
        return Batch.of(decoded, self.planner, self.owned)

    def _plan(self, batch: Batch, prior: WriteSet | None) -> Planned:
        """Loads the batch's rows (a short read on the control lane) and plans it."""
        if self.tracing is not None:
            links = [trace_headers(d.record.headers) for d in batch.decoded[:MAX_LINKS]]
            with self.tracing.span("saga.batch", links=links, attributes={"records": batch.size}):
                return self._plan_now(batch, prior)
        return self._plan_now(batch, prior)

    def _plan_now(self, batch: Batch, prior: WriteSet | None) -> Planned:
        started = time.perf_counter()
        loaded = self._control(lambda: self.control.load(batch.wants), "load")
        if prior is not None:
            loaded = overlay(loaded, prior)
        ws = self.planner.plan(batch.items, loaded, loaded.now, unrouted=batch.unrouted)
        self.hooks.fire("before-write")
        return Planned(batch, ws, time.perf_counter() - started)

    def _write(self, planned: Planned) -> None:
        """Writes and commits one planned batch; runs on the write lane."""
        if self.tracing is not None:
            with self.tracing.span("saga.commit", attributes={"records": planned.batch.size}):
                self._write_now(planned)
        else:
            self._write_now(planned)

    def _write_now(self, planned: Planned) -> None:
        started = time.perf_counter()
        self.store.write(
            planned.ws,
            planned.batch.offsets,
            before_commit=lambda: self.hooks.fire("before-commit"),
        )
        self.stats.last_commit_seconds = time.perf_counter() - started
        self.hooks.fire("after-commit")

    def _advance(self, batch: Batch) -> None:
        # The next batch is read and planned as if this one commits; resync undoes it if not.
        for commit in batch.offsets:
            owned = self.owned.get((commit.topic, commit.partition))
            if owned is not None and owned.epoch == commit.epoch:
                owned.next_offset = commit.next_offset

    def _committed(self, planned: Planned) -> None:
        self._availability.succeeded()
        self._writes_failing = False
        self.stats.batches += 1
        self.stats.records += planned.batch.size
        self.stats.counts.update(planned.ws.counts)
        if planned.ws.outcomes:
            # A new Counter, not an update in place: the metrics thread reads it meanwhile.
            self.stats.outcomes = self.stats.outcomes + planned.ws.outcomes
        if planned.batch.foreign:
            self.stats.foreign = self.stats.foreign + planned.batch.foreign
        if self.on_batch is not None:
            self.on_batch(self._done(planned), planned.ws)
        self.on_commit(planned.ws)
        if self.consumer is not None:
            self.consumer.commit_advisory(planned.batch.last)

    def _done(self, planned: Planned) -> BatchDone:
        batch = planned.batch
        topics = {t for t, _ in batch.last}
        if len(topics) == 1:
            per_topic: Mapping[str, int] = {topics.pop(): batch.size}
        else:
            per_topic = Counter(d.record.topic for d in batch.decoded)
        return BatchDone(
            batch.size, per_topic, planned.plan_seconds, self.stats.last_commit_seconds
        )

    def _isolate(self, batch: Batch) -> bool:
        """Dead-letters the records the database refuses, commits the rest of the batch."""
        # Offsets expect what the failed batch expected (nothing of it was committed), under
        # the epochs it had: not this replica's ownership now, which a revocation since may
        # have changed (the epoch check then refuses the write, as for any stale batch).
        positions = {(e.topic, e.partition): Owned(e.epoch, e.expected) for e in batch.offsets}

        def attempt(decoded: list[Decoded], dry_run: bool, park: Mapping[SagaKey, str]) -> WriteSet:
            part = Batch.of(decoded, self.planner, positions)
            loaded = self._control(lambda: self.control.load(part.wants), "load")
            ws = self.planner.plan(
                part.items, loaded, loaded.now, unrouted=part.unrouted, park=park
            )
            self._call(
                self._write_lane,
                lambda: self.store.write(ws, part.offsets, dry_run=dry_run),
                "batch write",
            )
            return ws

        try:
            ws = isolate_refused(
                batch.decoded, attempt, between=self._keep_polling, sagas_of=self._sagas_of
            )
        except RuntimeFailure as e:
            if e.kind is Failure.FATAL:
                raise
            log.warning("could not isolate the refused records (%s); resyncing", e)
            self._availability.failed()
            self._resync()
            return False
        self._committed(Planned(batch, ws))
        # The records read after the failed batch were dropped with the batch planned on it.
        self._resync()
        return False

    def _sagas_of(self, decoded: list[Decoded]) -> set[SagaKey]:
        # An operator's request is not parked behind its saga: a replay the database refuses
        # leaves the saga parked as it was, and the request is dead-lettered with the reason.
        items, _ = self.planner.route(d for d in decoded if not isinstance(d, Operator))
        return {(i.bound.saga_type, i.saga_id) for i in items if not isinstance(i, Rejected)}

    def _keep_polling(self) -> None:
        # A search through many refused records takes many trial writes: the consumer polls
        # meanwhile (at most once a second), so the group keeps this replica past its poll
        # interval and its rebalances are served. What it reads is dropped: the resync after
        # the search seeks every partition back to its stored position.
        now = self._clock()
        if self.consumer is None or now - self._polled_at < 1.0:
            return
        self._polled_at = now
        self.consumer.consume(self.batch_size, 0)

    # -- failures and recovery -----------------------------------------------------------------

    def _in_doubt(self, planned: Planned, error: RuntimeFailure) -> None:
        self.stats.rejected_batches += 1
        self._availability.failed()
        self._writes_failing = True
        log.warning(
            "batch of %d records: commit outcome unknown (%s); reading the stored offsets",
            planned.batch.size,
            error,
        )
        self._resync(in_doubt=planned)

    def _resync(self, in_doubt: Planned | None = None) -> bool:
        """After a failed or in-doubt commit: trust only what the store says was committed.

        An in-doubt batch is kept until the stored offsets can be read, however many tries
        that takes, so its outcome (and its parked sagas' and dead letters' log lines) is
        found rather than forgotten.
        """
        if not self._unsynced:
            self.stats.resyncs += 1
        self._unsynced = True
        self._drop_read_ahead()
        in_doubt = self._doubt = in_doubt or self._doubt
        if self._past_the_bound():
            # The partitions go back first (the caller's next step): another try of a database
            # that has not answered for the whole bound would only hold them longer.
            return False
        tps = list(self.owned)
        if in_doubt is not None:
            # Its partitions too, should they have been revoked since.
            tps += [tp for tp in in_doubt.batch.last if tp not in self.owned]
        try:
            stored = self._control(lambda: self.control.read_offsets(tps), "read offsets")
        except RuntimeFailure as e:
            if e.kind is Failure.FATAL:
                raise
            self._availability.failed(back_off=True)
            if in_doubt is not None:
                log.warning(
                    "batch of %d records: outcome still unknown (%s)", in_doubt.batch.size, e
                )
            else:
                log.warning("could not read the stored offsets (%s); trying again", e)
            return False
        self._doubt = None
        if in_doubt is not None:
            committed = all(
                stored.get((o.topic, o.partition)) == (o.epoch, o.next_offset)
                for o in in_doubt.batch.offsets
            )
            log.warning(
                "batch of %d records: outcome found: %s",
                in_doubt.batch.size,
                "committed" if committed else "not committed",
            )
            if committed:
                self._committed(in_doubt)
        self._unsynced = False
        if not self._writes_failing:
            # Reads that work end an outage, unless commits are what fails: then only a commit
            # does, so a replica that reads but cannot commit still gives its partitions back.
            self._availability.succeeded()
        lost = []
        for tp in tps:
            epoch, nxt = stored.get(tp, (None, None))
            if tp not in self.owned:
                continue  # revoked meanwhile
            if epoch != self.owned[tp].epoch:
                lost.append(tp)
                del self.owned[tp]
                continue
            self.owned[tp].next_offset = nxt
            if self.consumer is not None:
                self.consumer.seek(tp, nxt)
        if lost:
            self._publish_owned()
            log.warning("fenced out of %s: another replica owns them now", sorted(lost))
            if self.consumer is not None:
                self.consumer.pause(lost)
        return True

    def _drop_read_ahead(self) -> None:
        # Everything read past the stored positions is read again after the seeks back to them.
        self._carry = []
        self._deferred.clear()
        self._ends.clear()
        if self._follow_paused and self.consumer is not None:
            self.consumer.resume(sorted(self._follow_paused & set(self.owned)))
        self._follow_paused.clear()

    def _past_the_bound(self) -> bool:
        return (
            not self.detached
            and self.consumer is not None
            and self._availability.down_for() >= self.unavailable_timeout
        )

    def _give_back_if_unavailable(self) -> None:
        consumer = self.consumer
        if consumer is None or not self._past_the_bound():
            return
        down_for = self._availability.down_for()
        log.warning(
            "the database has been unavailable for %.0f s: giving this replica's partitions "
            "back to the group until it answers again",
            down_for,
        )
        self.detached = True
        self.owned.clear()
        self._publish_owned()
        self._unclaimed.clear()
        self._to_pause.clear()
        self._drop_read_ahead()
        consumer.leave()

    def _step_detached(self, consumer: RecordConsumer) -> int:
        # Serves the group's callbacks (the revocation) while away; nothing is assigned.
        consumer.consume(self.batch_size, self.batch_timeout)
        if not self._availability.may_try():
            return 0
        if self._doubt is not None:
            # A batch whose commit outcome is still unknown is resolved by the read that shows
            # the database answers; rejoining without it would forget it (and its log lines).
            if not self._resync():
                return 0
        else:
            try:
                self._control(lambda: self.control.read_offsets([]), "probe")
            except RuntimeFailure as e:
                if e.kind is Failure.FATAL:
                    raise
                self._availability.failed(back_off=True)
                return 0
        log.warning("the database answers again: rejoining the group")
        self.detached = False
        self._unsynced = False
        self._availability.succeeded()
        consumer.rejoin()
        return 0

    def _control(self, fn: Callable[[], _T], what: str) -> _T:
        return self._call(self._control_lane, fn, what)

    def _call(self, lane: Lane, fn: Callable[[], _T], what: str) -> _T:
        started = self._clock()
        try:
            return lane.call(fn, self.unavailable_timeout)
        except Stuck:
            # Hung since it began: that is when the outage began (the caller notes it too).
            self._availability.failed(since=started)
            if lane is self._control_lane:
                self._abandon_control_lane()
            else:
                self._abandon_write_lane()
            raise

    def _abandon_control_lane(self) -> None:
        self._control_lane.close()
        self._control_lane = Lane("batch-control")
        if self._store_factory is not None:
            self.control = self._store_factory()

    def _abandon_write_lane(self) -> None:
        # The stuck call keeps its connection; the server ends that session (its idle timeout)
        # and releases its locks, so the partitions' next owner is not blocked for long.
        self._write_lane.close()
        self._write_lane = Lane("batch-writer")
        if self._store_factory is not None:
            self.store = self._store_factory()
