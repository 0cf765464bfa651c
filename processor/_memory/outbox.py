"""An in-memory outbox, with its failed outbox, under the claim rules of the PostgreSQL one."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Unpack

from processor._authoring.choices import known_keywords
from processor._engine.records import OutboxRow
from processor._engine.rows import AuditEntry
from processor._memory.audit import MemoryAuditLog
from processor._ports import (
    FAILED_VALUE_PREVIEW,
    TP,
    FailedOutboxRow,
    FailedSelection,
    OutboxEntry,
    SetAside,
)

__all__ = ["MemoryOutboxStore"]


@dataclass
class _Settled:
    set_aside: list[SetAside]
    kept: dict[int, str | None]


class MemoryOutboxStore:
    """The outbox ports in memory: :class:`processor._ports.OutboxStore` and the failed outbox's.

    Rows get increasing ids as they are appended (as committed). A claim takes the lowest ids;
    they stay visible in :meth:`pending` until the claim's block ends normally, as an
    uncommitted delete stays invisible to other sessions. Rows of no source are claimed by one
    claim at a time: a second one, from any thread, does not get them while the first is open,
    nor does any claim while :meth:`held_elsewhere` is active. Rows of a source partition are
    claimed by claims that name the partition with its current epoch (:attr:`epochs`, moved by
    :meth:`take_over`), several at once, each while no older row of its saga from another source
    is still here. Operator calls wait for every open claim to end, as they take the relays'
    locks in PostgreSQL.
    """

    # Every row is in one place here: a claim never leaves rows for another round.
    more_waiting = False

    def __init__(self, audit: MemoryAuditLog | None = None) -> None:
        # Where operator retries and discards are recorded (shared with other stores if given).
        self.audit = audit if audit is not None else MemoryAuditLog()
        self._rows: dict[int, OutboxEntry] = {}
        self._created: dict[int, datetime] = {}
        self._failed: dict[int, FailedOutboxRow] = {}
        self._next_id = 1
        self._state = threading.Lock()
        self._changed = threading.Condition(self._state)
        # Stands for the relay's advisory lock; the relay only tries it, operators wait for it.
        self._relay_lock = threading.Lock()
        # The owner epoch of each partition, as the offsets rows hold it.
        self.epochs: dict[TP, int] = {}
        # Open claims per partition (FOR KEY SHARE), partitions being taken over (FOR UPDATE).
        self._claiming: Counter[TP] = Counter()
        self._taking: set[TP] = set()
        self._partition_claims = 0
        self._operators = 0
        self._in_flight: set[int] = set()
        self._settled = threading.local()
        self.closed = False

    def append(self, rows: Iterable[OutboxRow]) -> list[int]:
        """Adds committed rows; returns their ids, in order."""
        with self._state:
            ids = []
            for row in rows:
                self._rows[self._next_id] = OutboxEntry(self._next_id, row)
                self._created[self._next_id] = datetime.now(UTC)
                ids.append(self._next_id)
                self._next_id += 1
            return ids

    def pending(self) -> list[OutboxEntry]:
        """The committed rows not yet removed, in id order (``behind`` is not filled in)."""
        with self._state:
            return [self._rows[i] for i in sorted(self._rows)]

    def take_over(self, partitions: Iterable[TP]) -> dict[TP, int]:
        """A new owner's claim: bumps each partition's epoch once no claim on it is open."""
        tps = set(partitions)
        with self._changed:
            self._taking |= tps
            try:
                self._changed.wait_for(lambda: not any(self._claiming[tp] for tp in tps))
                for tp in tps:
                    self.epochs[tp] = self.epochs.get(tp, 0) + 1
            finally:
                self._taking -= tps
            return {tp: self.epochs[tp] for tp in tps}

    @contextmanager
    def held_elsewhere(self) -> Iterator[None]:
        """Within this block another relay holds the lock of the rows of no source."""
        if not self._relay_lock.acquire(blocking=False):
            raise RuntimeError("the relay lock is already held")
        try:
            yield
        finally:
            self._relay_lock.release()

    @contextmanager
    def claim(
        self,
        limit: int,
        owned: Mapping[TP, int] | None = None,
        max_bytes: int | None = None,
    ) -> Iterator[list[OutboxEntry] | None]:
        """Claims up to ``limit`` rows in id order; they are settled only on a normal exit."""
        global_path = self._relay_lock.acquire(blocking=False)
        with self._state:
            partitions = bool(owned) and not self._operators
            mine = {
                tp
                for tp, epoch in (owned or {}).items()
                if partitions and self.epochs.get(tp) == epoch and tp not in self._taking
            }
            if partitions:
                self._partition_claims += 1
                self._claiming.update(mine)
        if not global_path and not partitions:
            yield None
            return
        ids: list[int] = []
        # One pending settlement per thread; a claim nested in another restores the outer one.
        outer = getattr(self._settled, "value", None)
        try:
            with self._state:
                ids = self._pick(limit, global_path, mine, max_bytes)
                self._in_flight.update(ids)
                entries = [replace(self._rows[i], behind=self._first_failed(i)) for i in ids]
            self._settled.value = _Settled([], {})
            yield entries
            # Reached only when the block ended without an exception: the "commit".
            with self._state:
                self._commit(ids, self._settled.value)
        finally:
            self._settled.value = outer
            with self._changed:
                self._in_flight.difference_update(ids)
                if partitions:
                    self._partition_claims -= 1
                    self._claiming.subtract(mine)
                self._changed.notify_all()
            if global_path:
                self._relay_lock.release()

    def _pick(
        self, limit: int, global_path: bool, mine: set[TP], max_bytes: int | None
    ) -> list[int]:
        """The rows a claim takes, as PostgreSQL picks them.

        Rows of no source, then the partitions' oldest rows in what is left of the byte budget,
        less those the saga guard holds back (it no longer sees the rows of no source this claim
        took first).
        """
        free = [i for i in sorted(self._rows) if i not in self._in_flight]
        budget = max_bytes if max_bytes is not None else sys.maxsize
        unsourced = [i for i in free if global_path and self._rows[i].row.source is None]
        picked = self._within(unsourced[:limit], budget)
        budget -= sum(map(self._size, picked))
        window = [i for i in free if self._rows[i].row.source in mine][: limit - len(picked)]
        held = self._held(set(picked))
        return sorted(picked + [i for i in self._within(window, budget) if not held(i)])

    def _size(self, row_id: int) -> int:
        row = self._rows[row_id].row
        return len(row.value or b"") + len(row.key or b"")

    def _within(self, ids: list[int], budget: int) -> list[int]:
        """The first of ``ids`` while the ones before them hold fewer than ``budget`` bytes."""
        kept: list[int] = []
        held = 0
        for i in ids:
            if held >= budget:
                break
            kept.append(i)
            held += self._size(i)
        return kept

    def _held(self, gone: set[int]) -> Callable[[int], bool]:
        """Whether a row has an older row of its saga from another source (besides ``gone``).

        Per saga: the source of its oldest row, and the first id from another one. A row is
        held when it is of another source than the oldest, or comes after that first id.
        """
        first: dict[tuple[str, str], tuple[TP | None, int | None]] = {}
        for i in sorted(self._rows):
            r = self._rows[i].row
            if i in gone or r.saga_type is None or r.saga_id is None:
                continue
            key = (r.saga_type, r.saga_id)
            source, switch = first.setdefault(key, (r.source, None))
            if switch is None and r.source != source:
                first[key] = (source, i)

        def held(i: int) -> bool:
            r = self._rows[i].row
            if r.saga_type is None or r.saga_id is None:
                return False
            source, switch = first[(r.saga_type, r.saga_id)]
            return r.source != source or (switch is not None and i > switch)

        return held

    def _first_failed(self, row_id: int) -> int | None:
        row = self._rows[row_id].row
        if row.saga_id is None:
            return None
        found = [
            f.id
            for f in self._failed.values()
            if (f.row.saga_type, f.row.saga_id) == (row.saga_type, row.saga_id)
        ]
        return min(found) if found else None

    def expect(self, partitions: Collection[TP] | None) -> None:
        # One place: every claim looks at every row.
        return None

    def settle(self, set_aside: Sequence[SetAside], kept: Mapping[int, str | None]) -> None:
        settled: _Settled | None = getattr(self._settled, "value", None)
        if settled is None:
            raise RuntimeError("settle() outside an open claim")
        settled.set_aside.extend(set_aside)
        settled.kept.update(kept)

    def _commit(self, ids: list[int], settled: _Settled) -> None:
        now = datetime.now(UTC)
        for s in settled.set_aside:
            entry = self._rows[s.id]
            self._failed[s.id] = FailedOutboxRow(
                s.id,
                entry.row,
                len(entry.row.value),
                s.reason,
                s.attempts,
                s.held_behind,
                self._created[s.id],
                now,
            )
        for i in ids:
            if i in settled.kept:
                if settled.kept[i] is not None:
                    entry = self._rows[i]
                    self._rows[i] = replace(entry, attempts=entry.attempts + 1)
            else:
                del self._rows[i]
                if i not in self._failed:
                    del self._created[i]

    # -- the operator's side ---------------------------------------------------------------

    def list_failed(
        self, saga_type: str | None = None, saga_id: str | None = None, limit: int = 100
    ) -> list[FailedOutboxRow]:
        with self._state:
            picked = [
                f
                for f in sorted(self._failed.values(), key=lambda f: f.id)
                if (saga_type is None or f.row.saga_type == saga_type)
                and (saga_id is None or f.row.saga_id == saga_id)
            ][:limit]
            return [_shown(f) for f in picked]

    def retry_failed(self, **selection: Unpack[FailedSelection]) -> list[FailedOutboxRow]:
        known_keywords(selection, FailedSelection)
        saga_type, saga_id = selection.get("saga_type"), selection.get("saga_id")
        with self._operator():
            chosen = self._select(saga_type, saga_id, selection.get("row_id"))
            for f in chosen:
                del self._failed[f.id]
                self._rows[f.id] = OutboxEntry(f.id, f.row)
            self._audited(chosen, selection.get("audit"))
            return [_shown(f) for f in chosen]

    def discard_failed(self, **selection: Unpack[FailedSelection]) -> list[FailedOutboxRow]:
        known_keywords(selection, FailedSelection)
        saga_type, saga_id = selection.get("saga_type"), selection.get("saga_id")
        row_id = selection.get("row_id")
        with self._operator():
            chosen = [f for f in self._failed.values() if _picked(f, saga_type, saga_id, row_id)]
            for f in chosen:
                del self._failed[f.id]
                del self._created[f.id]
            self._audited(chosen, selection.get("audit"))
            return sorted((_shown(f) for f in chosen), key=lambda f: f.id)

    def _audited(self, rows: list[FailedOutboxRow], audit: AuditEntry | None) -> None:
        if audit is not None and rows:
            sagas = {(f.row.saga_type, f.row.saga_id) for f in rows}
            self.audit.record([audit.touching([f.id for f in rows], sagas)])

    @contextmanager
    def _operator(self) -> Iterator[None]:
        """Waits for every open claim to end and keeps new partition claims out meanwhile."""
        with self._relay_lock, self._changed:
            self._operators += 1
            try:
                self._changed.wait_for(lambda: not self._partition_claims)
                yield
            finally:
                self._operators -= 1

    def _select(
        self, saga_type: str | None, saga_id: str | None, row_id: int | None
    ) -> list[FailedOutboxRow]:
        if row_id is not None:
            found = self._failed.get(row_id)
            if found is None:
                return []
            if found.row.saga_id is None:
                return [found]
            saga_type, saga_id = found.row.saga_type, found.row.saga_id
        return sorted(
            (f for f in self._failed.values() if _picked(f, saga_type, saga_id, None)),
            key=lambda f: f.id,
        )

    def close(self) -> None:
        self.closed = True


def _picked(
    f: FailedOutboxRow, saga_type: str | None, saga_id: str | None, row_id: int | None
) -> bool:
    if row_id is not None:
        return f.id == row_id
    return f.row.saga_type == saga_type and f.row.saga_id == saga_id


def _shown(f: FailedOutboxRow) -> FailedOutboxRow:
    """``f`` as the PostgreSQL store returns it: its value cut to the preview (kept whole here)."""
    return replace(f, row=replace(f.row, value=f.row.value[:FAILED_VALUE_PREVIEW]))
