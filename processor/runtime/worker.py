"""The consumer loop: one batch per poll, one transaction per batch, offsets stored with effects.

Speaks only to ports: a :class:`~processor.ports.RecordConsumer` for records, and two
:class:`~processor.ports.BatchStore` handles (one commits on the writer thread while the other
serves rebalance callbacks, planning reads and resyncs on the consuming thread).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from processor.engine.decode import Event, Rejected, decode
from processor.engine.overlay import overlay
from processor.engine.plan import Item, Planner
from processor.engine.records import OffsetCommit, Record
from processor.engine.rows import Wants, WriteSet
from processor.errors import CommitInDoubt, Failure, RuntimeFailure
from processor.messages import MessageRegistry
from processor.ports import TP, BatchStore, RecordConsumer
from processor.runtime.hooks import Hooks

log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass
class _Owned:
    epoch: int
    next_offset: int | None


@dataclass
class WorkerStats:
    batches: int = 0
    records: int = 0
    rejected_batches: int = 0
    counts: Counter[str] = field(default_factory=Counter)


class Worker:
    """Drives one consumer. `poll_once()` is the single step; `run()` loops it."""

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
    ) -> None:
        self.store = store
        # Rebalance callbacks and resync use their own connection (see on_assign).
        self.control = control
        self.planner = planner
        self.registry = registry
        self.owner = owner
        self.max_record_bytes = max_record_bytes
        self.batch_size = batch_size
        self.batch_timeout = batch_timeout
        self.on_commit = on_commit
        self.owned: dict[TP, _Owned] = {}
        self.stats = WorkerStats()
        self.consumer: RecordConsumer | None = None
        self._failures = 0
        # One writer thread: batch N commits there while batch N+1 is read and planned.
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-writer")
        self._pending: tuple[_Planned, Future[None]] | None = None
        # Named points of a batch ("before-write", "before-commit", "after-commit") where crash
        # tests inject faults.
        self.hooks = hooks or Hooks()

    # -- rebalance callbacks (run inside consume(), on the consuming thread) --------------------

    def on_assign(self, tps: list[TP]) -> Mapping[TP, int | None]:
        # The control connection, not the batch one: a batch may be committing on the writer
        # thread while the consumer runs this callback.
        claimed = self._claim(tps)
        for tp, (epoch, nxt) in claimed.items():
            self.owned[tp] = _Owned(epoch, nxt)
        log.info("assigned %s", sorted(claimed))
        return {tp: o for tp, (_, o) in claimed.items()}

    def _claim(self, tps: list[TP]) -> dict[TP, tuple[int, int | None]]:
        # A frozen previous owner may hold these rows until the server ends its idle
        # transaction; wait for that (each try is bounded by lock_timeout) rather than crash out
        # of the rebalance and leave the partitions to yet another replica.
        for attempt in range(1, 11):
            try:
                return self.control.claim(tps, self.owner)
            except RuntimeFailure as e:
                if e.kind is not Failure.RETRYABLE:
                    raise
                log.warning(
                    "could not claim %s yet (try %d): %s; their last owner may still hold them",
                    sorted(tps),
                    attempt,
                    e,
                )
        return self.control.claim(tps, self.owner)

    def on_revoke(self, tps: list[TP]) -> None:
        # A batch of these partitions still committing is safe: the new owner's claim bumps the
        # epoch, so whichever of the two commits comes second is rejected.
        for tp in tps:
            self.owned.pop(tp, None)
        log.info("revoked %s", sorted(tps))

    # -- the loop ----------------------------------------------------------------------------

    def poll_once(self) -> int:
        """One step: read and plan batch N+1 while batch N commits on the writer thread.

        Planning N+1 needs N's effects before they are committed: the rows it loads are overlaid
        with N's writes, and its offsets and saga versions expect N's. Every write is still a
        compare-and-set, so if N does not commit, N+1 cannot either: it is dropped here and the
        positions are reset to what Postgres holds.
        """
        assert self.consumer is not None
        records = self.consumer.consume(self.batch_size, self.batch_timeout)
        planned: _Planned | None = None
        try:
            batch = self._prepare(records)
            if batch is not None:
                prior = self._pending[0].ws if self._pending is not None else None
                planned = self._plan(batch, prior)
        except RuntimeFailure as e:
            if e.kind is not Failure.RETRYABLE:
                raise
            # The control connection failed mid-read: settle what is in flight, then resync.
            log.warning("could not plan a batch (%s); resyncing", e)
            if self.settle():
                self._resync()
            return len(records)
        if not self.settle():
            return len(records)
        if planned is not None:
            self._pending = (planned, self._writer.submit(self._write, planned))
            self._advance(planned.batch)
        return len(records)

    def settle(self) -> bool:
        """Waits for the batch in flight; False when it was rolled back and positions resynced."""
        if self._pending is None:
            return True
        planned, future = self._pending
        self._pending = None
        try:
            future.result()
        except CommitInDoubt as e:
            self.stats.rejected_batches += 1
            log.warning(
                "batch of %d records: commit outcome unknown (%s); reading the stored offsets",
                planned.batch.size,
                e,
            )
            self._resync(in_doubt=planned.batch)
            return False
        except RuntimeFailure as e:
            if e.kind is Failure.FATAL:
                raise
            self.stats.rejected_batches += 1
            if e.kind is Failure.FENCED:
                log.warning(
                    "batch of %d records not committed: fenced (%s); resyncing",
                    planned.batch.size,
                    e,
                )
            else:
                log.warning(
                    "batch of %d records not committed (%s: %s); resyncing",
                    planned.batch.size,
                    e.kind,
                    e,
                )
            self._resync()
            return False
        self._committed(planned)
        return True

    def close(self) -> None:
        """Lets the batch in flight finish (commit or roll back), then stops the writer."""
        self.settle()
        self._writer.shutdown(wait=True)

    def _prepare(self, records: list[Record]) -> _Batch | None:
        # Positions are those the batch in flight (if any) will leave behind: see _advance.
        mine = [
            decode(r, self.registry, self.max_record_bytes)
            for r in records
            if (o := self.owned.get((r.topic, r.partition))) is not None
            and (o.next_offset is None or r.offset >= o.next_offset)
        ]
        if not mine:
            return None
        items, wants = self.planner.route(mine)
        routed = self.planner.event_types  # a fresh set per access: taken once per batch
        unrouted = sum(1 for d in mine if isinstance(d, Event) and type(d.message) not in routed)
        last: dict[TP, int] = {}
        for d in mine:
            last[(d.record.topic, d.record.partition)] = d.record.offset + 1
        offsets = [
            OffsetCommit(t, p, nxt, self.owned[(t, p)].next_offset, self.owned[(t, p)].epoch)
            for (t, p), nxt in last.items()
        ]
        return _Batch(items, wants, unrouted, offsets, last, len(mine))

    def _plan(self, batch: _Batch, prior: WriteSet | None) -> _Planned:
        """Loads the batch's rows (a short read on the control connection) and plans it."""
        loaded = self.control.load(batch.wants)
        if prior is not None:
            loaded = overlay(loaded, prior)
        ws = self.planner.plan(batch.items, loaded, loaded.now, unrouted=batch.unrouted)
        self.hooks.fire("before-write")
        return _Planned(batch, ws)

    def _write(self, planned: _Planned) -> None:
        """Writes and commits one planned batch; runs on the writer thread."""
        self.store.write(
            planned.ws,
            planned.batch.offsets,
            before_commit=lambda: self.hooks.fire("before-commit"),
        )
        self.hooks.fire("after-commit")

    def _advance(self, batch: _Batch) -> None:
        # The next batch is read and planned as if this one commits; resync undoes it if not.
        for commit in batch.offsets:
            owned = self.owned.get((commit.topic, commit.partition))
            if owned is not None and owned.epoch == commit.epoch:
                owned.next_offset = commit.next_offset

    def _committed(self, planned: _Planned) -> None:
        self._failures = 0
        self.stats.batches += 1
        self.stats.records += planned.batch.size
        self.stats.counts.update(planned.ws.counts)
        self.on_commit(planned.ws)
        if self.consumer is not None:
            self.consumer.commit_advisory(planned.batch.last)

    def _resync(self, in_doubt: _Batch | None = None) -> None:
        """After a failed or in-doubt commit: trust only what the store says was committed."""
        while True:
            self._failures += 1
            if self._failures > 1:
                # Bounded backoff while the database is unreachable; never a hot loop.
                time.sleep(min(5.0, 0.1 * 2 ** min(self._failures, 6)))
            tps = list(self.owned)
            try:
                stored = self.control.read_offsets(tps)
                break
            except RuntimeFailure as e:
                if e.kind is not Failure.RETRYABLE:
                    raise
                log.warning("could not read the stored offsets (%s); trying again", e)
        if in_doubt is not None:
            applied = all(
                stored.get((o.topic, o.partition), (None, None)) == (o.epoch, o.next_offset)
                for o in in_doubt.offsets
            )
            log.warning(
                "batch of %d records: outcome found: %s",
                in_doubt.size,
                "committed" if applied else "not committed",
            )
            if applied:
                self._failures = 0
        lost = []
        for tp in tps:
            epoch, nxt = stored.get(tp, (None, None))
            if epoch != self.owned[tp].epoch:
                lost.append(tp)
                del self.owned[tp]
                continue
            self.owned[tp].next_offset = nxt
            if self.consumer is not None:
                self.consumer.seek(tp, nxt)
        if lost:
            log.warning("fenced out of %s: another replica owns them now", sorted(lost))
            if self.consumer is not None:
                self.consumer.pause(lost)


@dataclass(frozen=True, slots=True)
class _Batch:
    items: list[Item | Rejected]
    wants: Wants
    unrouted: int
    offsets: list[OffsetCommit]
    last: dict[TP, int]
    size: int


@dataclass(frozen=True, slots=True)
class _Planned:
    batch: _Batch
    ws: WriteSet
