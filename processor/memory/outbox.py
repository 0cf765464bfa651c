"""An in-memory outbox, with its failed outbox, under the claim rules of the PostgreSQL one."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from processor.engine.records import OutboxRow
from processor.ports import FailedOutboxRow, OutboxEntry, SetAside

__all__ = ["MemoryOutboxStore"]


@dataclass
class _Settled:
    set_aside: list[SetAside]
    kept: dict[int, str | None]


class MemoryOutboxStore:
    """The outbox ports in memory: :class:`processor.ports.OutboxStore` and the failed outbox's.

    Rows get increasing ids as they are appended (as committed). A claim takes the lowest ids;
    they stay visible in :meth:`pending` until the claim's block ends normally, as an
    uncommitted delete stays invisible to other sessions. One claim at a time: a second one,
    from any thread, yields None while the first is open, as does every claim while
    :meth:`held_elsewhere` is active. Operator calls wait for an open claim to end, as they take
    the relay's lock in PostgreSQL.
    """

    def __init__(self) -> None:
        self._rows: dict[int, OutboxEntry] = {}
        self._created: dict[int, datetime] = {}
        self._failed: dict[int, FailedOutboxRow] = {}
        self._next_id = 1
        self._state = threading.Lock()
        # Stands for the relay's advisory lock; the relay only tries it, operators wait for it.
        self._relay_lock = threading.Lock()
        self._settled: _Settled | None = None
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

    @contextmanager
    def held_elsewhere(self) -> Iterator[None]:
        """Within this block another relay holds the lock: every claim yields None."""
        if not self._relay_lock.acquire(blocking=False):
            raise RuntimeError("the relay lock is already held")
        try:
            yield
        finally:
            self._relay_lock.release()

    @contextmanager
    def claim(self, limit: int) -> Iterator[list[OutboxEntry] | None]:
        """Claims up to ``limit`` rows in id order; they are settled only on a normal exit."""
        if not self._relay_lock.acquire(blocking=False):
            yield None
            return
        try:
            with self._state:
                ids = sorted(self._rows)[:limit]
                entries = [replace(self._rows[i], behind=self._first_failed(i)) for i in ids]
            self._settled = _Settled([], {})
            yield entries
            # Reached only when the block ended without an exception: the "commit".
            with self._state:
                self._commit(ids, self._settled)
        finally:
            self._settled = None
            self._relay_lock.release()

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

    def settle(self, set_aside: Sequence[SetAside], kept: Mapping[int, str | None]) -> None:
        if self._settled is None:
            raise RuntimeError("settle() outside an open claim")
        self._settled.set_aside.extend(set_aside)
        self._settled.kept.update(kept)

    def _commit(self, ids: list[int], settled: _Settled) -> None:
        now = datetime.now(UTC)
        for s in settled.set_aside:
            entry = self._rows[s.id]
            self._failed[s.id] = FailedOutboxRow(
                s.id, entry.row, s.reason, s.attempts, s.held_behind, self._created[s.id], now
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
            return [
                f
                for f in sorted(self._failed.values(), key=lambda f: f.id)
                if (saga_type is None or f.row.saga_type == saga_type)
                and (saga_id is None or f.row.saga_id == saga_id)
            ][:limit]

    def retry_failed(
        self, *, saga_type: str | None = None, saga_id: str | None = None, row_id: int | None = None
    ) -> list[FailedOutboxRow]:
        with self._relay_lock, self._state:
            chosen = self._select(saga_type, saga_id, row_id)
            for f in chosen:
                del self._failed[f.id]
                self._rows[f.id] = OutboxEntry(f.id, f.row)
            return chosen

    def discard_failed(
        self, *, saga_type: str | None = None, saga_id: str | None = None, row_id: int | None = None
    ) -> list[FailedOutboxRow]:
        with self._relay_lock, self._state:
            chosen = [f for f in self._failed.values() if _picked(f, saga_type, saga_id, row_id)]
            for f in chosen:
                del self._failed[f.id]
                del self._created[f.id]
            return sorted(chosen, key=lambda f: f.id)

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
