"""An in-memory deadline store: the Postgres adapter's lease and claim rules over a given clock.

Tests move the clock to expire a lease or make a dispatch stale without waiting; they add
deadline rows as a batch would and delete them as the consumer would after handling them.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from processor._errors import Retryable
from processor._ports import DeadlineRow

__all__ = ["DeadlineRow", "DeadlineTable", "Lease", "MemoryDeadlineStore"]

Clock = Callable[[], datetime]

# Longest single real-time wait, so `wake` and `stop` are noticed promptly.
_WAIT_CHUNK = 0.05


class DeadlineTable(dict[str, DeadlineRow]):
    """The deadline table in memory: rows by id, in the order they were stored.

    The one in-memory deadline table: the batch store writes and loads its rows (as
    :attr:`processor._memory.store.MemoryTables.deadlines`), the deadline store claims and resets
    them. A dict, so that tests read it as one. The deadline store changes a row by replacing
    it, so a row it returned stays as it was read.
    """

    def put(self, row: DeadlineRow) -> None:
        """Stores ``row`` under its id, last among rows due at the same time, as an insert."""
        self.pop(row.id, None)
        self[row.id] = row

    def in_due_order(self, rows: Iterable[DeadlineRow] | None = None) -> list[DeadlineRow]:
        """``rows`` (default: every row) by due time; rows due together in the order stored."""
        order = {row_id: n for n, row_id in enumerate(self)}
        chosen = self.values() if rows is None else rows
        return sorted(chosen, key=lambda r: (r.due_at, order[r.id]))

    def next_due_in(self, now: datetime) -> float | None:
        """Seconds until the next row not yet due comes due; None when none is pending."""
        future = [r.due_at for r in self.values() if r.due_at > now]
        return (min(future) - now).total_seconds() if future else None

    def reset(self, row_id: str, token: int) -> None:
        """Makes the row due again when it was dispatched under ``token``."""
        r = self.get(row_id)
        if r is not None and r.dispatch_token == token:
            self[row_id] = replace(r, dispatched_at=None)

    def removed_by(
        self, clears: Iterable[tuple[str, str]], deletes: Iterable[tuple[str, str, str]]
    ) -> list[str]:
        """Ids of the rows that a batch's clears (every row of a saga) and deletes remove."""
        cleared = set(clears)
        deleted = set(deletes)
        return [
            row_id
            for row_id, r in self.items()
            if (r.saga_type, r.saga_id) in cleared or (r.saga_type, r.saga_id, r.name) in deleted
        ]


@dataclass(frozen=True, slots=True)
class Lease:
    """The lease row: who holds it, under which token, until when."""

    holder: str
    token: int
    expires_at: datetime


class MemoryDeadlineStore:
    """:class:`processor._ports.DeadlineStore` in memory, thread-safe.

    Args:
        clock: The store's "database clock": returns timezone-aware datetimes.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or (lambda: datetime.now(UTC))
        self._lock = threading.Lock()
        self._rows = DeadlineTable()
        self._lease: Lease | None = None
        self._failing = 0
        self._parked: set[tuple[str, str]] = set()
        # Set when a deadline is added: the in-memory NOTIFY.
        self._notified = threading.Event()

    # -- for tests ---------------------------------------------------------------------------

    def add(
        self,
        saga_type: str,
        saga_id: str,
        name: str,
        due_at: datetime,
        *,
        topic: str = "saga-input",
        partition: int = 0,
        id: str | None = None,
    ) -> str:
        """Stores a deadline as a batch would, and notifies a waiting poller; returns its id."""
        row_id = id or str(uuid.uuid4())
        with self._lock:
            self._rows.put(
                DeadlineRow(row_id, saga_type, saga_id, name, due_at, None, topic, partition)
            )
        self._notified.set()
        return row_id

    def delete(self, row_id: str) -> None:
        """Removes a deadline, as the consumer does once its fired record was handled."""
        with self._lock:
            self._rows.pop(row_id, None)

    def rows(self) -> list[DeadlineRow]:
        """Every stored deadline, in due order."""
        with self._lock:
            return self._rows.in_due_order()

    def row(self, row_id: str) -> DeadlineRow:
        """One stored deadline by id."""
        with self._lock:
            return self._rows[row_id]

    @property
    def lease(self) -> Lease | None:
        """The lease row, or None before anyone took it."""
        with self._lock:
            return self._lease

    def park(self, saga_type: str, saga_id: str, parked: bool = True) -> None:
        """Marks a saga parked (its deadlines are not claimed) or, with False, active again."""
        with self._lock:
            if parked:
                self._parked.add((saga_type, saga_id))
            else:
                self._parked.discard((saga_type, saga_id))
        if not parked:
            self._notified.set()

    def reset(self, row_id: str, token: int) -> None:
        """Makes a row dispatched under ``token`` due again, as the consumer does."""
        with self._lock:
            self._rows.reset(row_id, token)
        self._notified.set()

    def fail_next(self, n: int = 1) -> None:
        """Makes the next ``n`` calls raise ``Retryable``, as a lost connection would."""
        with self._lock:
            self._failing = n

    # -- the port ----------------------------------------------------------------------------

    def acquire(self, holder: str, ttl_seconds: float, held: int | None = None) -> int | None:
        """Takes or renews the lease; its fencing token, or None while another holds it."""
        with self._lock:
            self._check()
            now = self._clock()
            expires_at = now + timedelta(seconds=ttl_seconds)
            lease = self._lease
            if lease is None:
                self._lease = Lease(holder, 1, expires_at)
                return 1
            renewal = lease.holder == holder and lease.token == held
            if not renewal and lease.expires_at > now:
                return None
            token = lease.token if renewal else lease.token + 1
            self._lease = Lease(holder, token, expires_at)
            return token

    def claim_due(
        self, holder: str, token: int, limit: int, *, full: bool
    ) -> tuple[list[DeadlineRow], float | None]:
        """Claims due deadlines under ``token``; see :class:`processor._ports.DeadlineStore`."""
        with self._lock:
            self._check()
            now = self._clock()
            lease = self._lease
            ours = (
                lease is not None
                and lease.holder == holder
                and lease.token == token
                and lease.expires_at > now
            )

            def claimable(r: DeadlineRow) -> bool:
                if r.due_at > now or (r.saga_type, r.saga_id) in self._parked:
                    return False
                if not full:
                    return r.dispatched_at is None
                return r.dispatch_token != token or r.dispatched_at is None

            taken = self._rows.in_due_order(r for r in self._rows.values() if claimable(r))
            taken = taken[:limit]
            if not ours:
                taken = []
            # Replaced, not changed: the rows returned stay as claimed.
            claimed = [replace(r, dispatched_at=now, dispatch_token=token) for r in taken]
            for r in claimed:
                self._rows[r.id] = r
            due = self._rows.next_due_in(now) if len(taken) < limit else None
            return claimed, due

    def unclaim(self, ids: Sequence[str], token: int) -> None:
        """Makes rows dispatched under ``token`` due again."""
        with self._lock:
            self._check()
            for row_id in ids:
                self._rows.reset(row_id, token)

    def next_due_in(self) -> float | None:
        """Seconds until the next deadline not yet due comes due; None when none is pending."""
        with self._lock:
            self._check()
            return self._rows.next_due_in(self._clock())

    def wait(self, seconds: float, stop: threading.Event, wake: threading.Event) -> None:
        """Sleeps up to ``seconds`` of real time.

        Returns early once a deadline is added, or on ``wake`` or ``stop``.
        """
        with self._lock:
            self._check()
        remaining = seconds
        while remaining > 0 and not stop.is_set() and not wake.is_set():
            chunk = min(remaining, _WAIT_CHUNK)
            if self._notified.wait(chunk):
                self._notified.clear()
                return
            remaining -= chunk

    def close(self) -> None:
        """Nothing to release."""

    # -- helpers -----------------------------------------------------------------------------

    def _check(self) -> None:
        if self._failing > 0:
            self._failing -= 1
            raise Retryable("injected store failure")
