"""An in-memory :class:`processor._ports.RetentionStore` over the memory batch store's tables.

:class:`~processor._memory.store.MemoryTables` keep no times, so this store stamps each row with
its clock the first time it sees it (in any call, or in :meth:`MemoryRetentionStore.observe`):
a test that wants rows to be old observes them, then moves the clock forward. Failed outbox rows
are stamped too (the memory outbox's own times are the real clock's); tombstones keep their
saga's end time (the batch store's clock: give both stores the same one). Otherwise the rules are
the PostgreSQL store's, kind by kind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from processor._engine.rows import HistoryRow, Outcome, SagaKey, SagaStatus
from processor._memory.outbox import MemoryOutboxStore
from processor._memory.store import MemoryTables
from processor._ports import FailedOutboxRow, Purge

__all__ = ["MemoryRetentionStore"]

# An ended saga's row goes only once at most this many history rows are left (the PostgreSQL
# statement deletes these few with it).
_FEW_LEFT = 10


@dataclass
class _Shared:
    """What every replica's store over the same tables shares."""

    clock: Callable[[], datetime]
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Rows by identity: (the row, when first seen); the row is kept so its id is not reused.
    rows: dict[int, tuple[object, datetime]] = field(default_factory=dict)
    parked: dict[int, datetime] = field(default_factory=dict)
    ended: dict[SagaKey, datetime] = field(default_factory=dict)
    failed: dict[int, datetime] = field(default_factory=dict)


class MemoryRetentionStore:
    """:class:`processor._ports.RetentionStore` over :class:`MemoryTables`.

    Args:
        tables: The batch store's tables (sagas, history, dead letters, held messages,
            tombstones).
        outbox: The failed outbox's store, if failed rows are to be purged too.
        clock: The store's clock (the database's in PostgreSQL); ages are measured by it.
    """

    def __init__(
        self,
        tables: MemoryTables,
        outbox: MemoryOutboxStore | None = None,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        _shared: _Shared | None = None,
    ) -> None:
        self.tables = tables
        self.outbox = outbox
        self._shared = _shared if _shared is not None else _Shared(clock)
        self.closed = False

    def replica(self) -> MemoryRetentionStore:
        """Another replica's store over the same tables: one lock, one clock, one set of times."""
        return MemoryRetentionStore(self.tables, self.outbox, _shared=self._shared)

    @contextmanager
    def held_elsewhere(self) -> Iterator[None]:
        """Within this block another replica's retention holds the lock."""
        if not self._shared.lock.acquire(blocking=False):
            raise RuntimeError("the retention lock is already held")
        try:
            yield
        finally:
            self._shared.lock.release()

    def observe(self) -> None:
        """Stamps every row not seen before with the clock's time now."""
        self._stamp(self._shared.clock())

    def purge(self, what: Purge, older_than: timedelta, limit: int) -> int | None:
        if not self._shared.lock.acquire(blocking=False):
            return None
        try:
            now = self._shared.clock()
            self._stamp(now)
            return self._purge(what, now - older_than, max(limit, 0))
        finally:
            self._shared.lock.release()

    def close(self) -> None:
        self.closed = True

    # -- times ---------------------------------------------------------------------------------

    def _stamp(self, now: datetime) -> None:
        s, t = self._shared, self.tables
        present = {id(r): r for r in (*t.history, *t.dead_letters)}
        for key in [k for k in s.rows if k not in present]:
            del s.rows[key]
        for key, row in present.items():
            s.rows.setdefault(key, (row, now))
        ids = self.tables.held_ids()
        for gone in set(s.parked) - set(ids):
            del s.parked[gone]
        for pid in ids:
            s.parked.setdefault(pid, now)
        ended = {k for k, row in t.sagas.items() if row.status == SagaStatus.ENDED}
        for saga in set(s.ended) - ended:
            del s.ended[saga]
        for saga in ended:
            s.ended.setdefault(saga, now)
        failed = {f.id for f in self._failed()}
        for gone in set(s.failed) - failed:
            del s.failed[gone]
        for row_id in failed:
            s.failed.setdefault(row_id, now)

    def _failed(self) -> list[FailedOutboxRow]:
        return [] if self.outbox is None else self.outbox.list_failed(limit=1 << 62)

    def _seen(self, row: object) -> datetime:
        return self._shared.rows[id(row)][1]

    # -- the kinds -----------------------------------------------------------------------------

    def _purge(self, what: Purge, cutoff: datetime, limit: int) -> int:
        t = self.tables
        if what is Purge.ENDED_HISTORY:
            sagas = set(self._ended_before(cutoff)[:limit])
            return self._drop_history(
                [h for h in t.history if (h.saga_type, h.saga_id) in sagas][:limit]
            )
        if what is Purge.ENDED_SAGAS:
            return self._purge_ended(cutoff, limit)
        if what in (Purge.HISTORY, Purge.APPLIED):
            old = [
                h
                for h in t.history
                if self._seen(h) < cutoff
                and not self._live((h.saga_type, h.saga_id))
                and (what is Purge.APPLIED or h.outcome is not Outcome.APPLIED)
            ]
            return self._drop_history(sorted(old, key=self._seen)[:limit])
        if what is Purge.TOMBSTONES:
            old_keys = sorted(
                (k for k, at in t.tombstones.items() if at < cutoff), key=t.tombstones.__getitem__
            )[:limit]
            for key in old_keys:
                del t.tombstones[key]
            return len(old_keys)
        if what is Purge.DEAD_LETTERS:
            letters = sorted((d for d in t.dead_letters if self._seen(d) < cutoff), key=self._seen)
            gone = {id(d) for d in letters[:limit]}
            t.dead_letters = [d for d in t.dead_letters if id(d) not in gone]
            return len(gone)
        if what is Purge.PARKED:
            return self._purge_parked(cutoff, limit)
        return self._purge_failed(cutoff, limit)

    def _ended_before(self, cutoff: datetime) -> list[SagaKey]:
        ended = self._shared.ended
        return sorted((k for k, at in ended.items() if at < cutoff), key=ended.__getitem__)

    def _live(self, key: SagaKey) -> bool:
        row = self.tables.sagas.get(key)
        return row is not None and row.status != SagaStatus.ENDED

    def _drop_history(self, rows: Sequence[HistoryRow]) -> int:
        t = self.tables
        gone = {id(r) for r in rows}
        for h in t.history:
            if id(h) in gone and h.outcome is Outcome.APPLIED:
                t.applied.discard((h.saga_type, h.saga_id, h.message_id))
        t.history = [h for h in t.history if id(h) not in gone]
        return len(gone)

    def _purge_ended(self, cutoff: datetime, limit: int) -> int:
        t = self.tables
        left: dict[SagaKey, int] = {}
        for h in t.history:
            key = (h.saga_type, h.saga_id)
            left[key] = left.get(key, 0) + 1
        victims = [k for k in self._ended_before(cutoff) if left.get(k, 0) <= _FEW_LEFT][:limit]
        for key in victims:
            del t.sagas[key]
            t.tombstones[key] = self._shared.ended.pop(key)
        gone = set(victims)
        self._drop_history([h for h in t.history if (h.saga_type, h.saga_id) in gone])
        return len(victims)

    def _purge_parked(self, cutoff: datetime, limit: int) -> int:
        t, stamps = self.tables, self._shared.parked
        parked_sagas = {k for k, row in t.sagas.items() if row.status == SagaStatus.PARKED}
        old = sorted(
            (
                pid
                for pid, p in zip(self.tables.held_ids(), t.parked, strict=True)
                if stamps[pid] < cutoff and (p.saga_type, p.saga_id) not in parked_sagas
            ),
            key=stamps.__getitem__,
        )
        gone = set(old[:limit])
        kept = [(i, p) for i, p in zip(t.parked_ids, t.parked, strict=True) if i not in gone]
        t.parked_ids = [i for i, _ in kept]
        t.parked = [p for _, p in kept]
        return len(gone)

    def _purge_failed(self, cutoff: datetime, limit: int) -> int:
        stamps = self._shared.failed
        old = sorted((i for i, at in stamps.items() if at < cutoff), key=lambda i: (stamps[i], i))
        for row_id in old[:limit]:
            assert self.outbox is not None  # no stamps without it
            self.outbox.discard_failed(row_id=row_id)
        return len(old[:limit])
