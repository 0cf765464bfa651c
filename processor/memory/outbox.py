"""An in-memory outbox with the claim rules of the PostgreSQL one."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from processor.engine.records import OutboxRow
from processor.ports import OutboxEntry

__all__ = ["MemoryOutboxStore"]


class MemoryOutboxStore:
    """:class:`processor.ports.OutboxStore` in memory.

    Rows get increasing ids as they are appended (as committed). A claim takes the lowest ids;
    they stay visible in :meth:`pending` until the claim's block ends normally, as an
    uncommitted delete stays invisible to other sessions. One claim at a time: a second one,
    from any thread, yields None while the first is open, as does every claim while
    :meth:`held_elsewhere` is active.
    """

    def __init__(self) -> None:
        self._rows: dict[int, OutboxRow] = {}
        self._next_id = 1
        self._state = threading.Lock()
        # Stands for the relay's advisory lock; never waited on, only tried.
        self._relay_lock = threading.Lock()
        self.closed = False

    def append(self, rows: Iterable[OutboxRow]) -> list[int]:
        """Adds committed rows; returns their ids, in order."""
        with self._state:
            ids = []
            for row in rows:
                self._rows[self._next_id] = row
                ids.append(self._next_id)
                self._next_id += 1
            return ids

    def pending(self) -> list[OutboxEntry]:
        """The committed rows not yet removed, in id order."""
        with self._state:
            return [OutboxEntry(i, self._rows[i]) for i in sorted(self._rows)]

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
        """Claims up to ``limit`` rows in id order; they are removed only on a normal exit."""
        if not self._relay_lock.acquire(blocking=False):
            yield None
            return
        try:
            with self._state:
                ids = sorted(self._rows)[:limit]
                entries = [OutboxEntry(i, self._rows[i]) for i in ids]
            yield entries
            # Reached only when the block ended without an exception: the "commit".
            with self._state:
                for i in ids:
                    del self._rows[i]
        finally:
            self._relay_lock.release()

    def close(self) -> None:
        self.closed = True
