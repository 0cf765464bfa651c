"""The deadline poller's port: the deadline table, its lease and its claims."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from processor._engine.rows import DeadlineInsert, DeadlineRef
from processor._wire import FiredRecord


@dataclass(slots=True)
class DeadlineRow(DeadlineInsert):
    """One stored deadline: the row a batch inserts, and how a poller last dispatched it.

    The one row type of the deadline table: a claim returns it to the poller, the operator's
    commands list it, and the in-memory stores keep their table of it. Not frozen: the
    in-memory tables change a row in place, as the table's UPDATE does (a claim, a dispatch, a
    reset).

    Attributes:
        dispatched_at: When a poller last produced its fired record, or None.
        dispatch_token: Lease token of that poller, or None.

    The other fields are :class:`processor._engine.rows.DeadlineInsert`'s.
    """

    dispatched_at: datetime | None = None
    dispatch_token: int | None = None

    @property
    def ref(self) -> DeadlineRef:
        """The row as a batch loads it."""
        return DeadlineRef(
            self.saga_type, self.saga_id, self.name, self.due_at, self.payload, self.dispatch_token
        )

    def fired(self, token: int) -> FiredRecord:
        """The record that fires the row, dispatched under the lease ``token``."""
        return FiredRecord(self.saga_type, self.saga_id, self.id, self.name, token, self.due_at)


class DeadlineStore(Protocol):
    """The deadline poller's side of the store. Every time is the database's clock."""

    def acquire(self, holder: str, ttl_seconds: float, held: int | None = None) -> int | None:
        """Takes or renews the poller lease; its fencing token, or None when another holds it.

        Only a renewal keeps the token: the same ``holder`` passing the token it ``held``.
        Every other caller (a restarted process under the same holder name included) waits for
        the lease to expire and then gets a new, larger token, so anything an earlier
        incarnation still sends is stale.
        """
        ...

    def claim_due(
        self, holder: str, token: int, limit: int, *, full: bool
    ) -> tuple[list[DeadlineRow], float | None]:
        """Marks up to ``limit`` due deadlines dispatched under ``token``, while the lease is ours.

        The lease is checked in the same statement. Deadlines of parked sagas are never claimed
        (their retry makes them claimable again).

        ``full`` also takes rows dispatched under another token (an earlier leader's, whose
        records can no longer apply). Returns the rows, and, when fewer than ``limit`` were due,
        the seconds until the next one comes due (None when none is pending).
        """
        ...

    def unclaim(self, ids: Sequence[str], token: int) -> None:
        """Makes rows whose fired records were not acknowledged due again."""
        ...

    def next_due_in(self) -> float | None:
        """Seconds until the next deadline not yet due comes due; None when none is pending."""
        ...

    def wait(self, seconds: float, stop: threading.Event, wake: threading.Event) -> None:
        """Sleeps up to ``seconds``.

        Returns early when deadlines were committed anywhere (NOTIFY in production), when
        ``wake`` is set, or when ``stop`` is set.
        """
        ...

    def close(self) -> None: ...
