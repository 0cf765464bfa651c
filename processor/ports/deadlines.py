"""The deadline poller's port: the deadline table, its lease and its claims."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from processor.engine.rows import DeadlineRef


@dataclass(frozen=True, slots=True)
class Due:
    """A deadline claimed for firing by the lease holder."""

    id: str
    saga_type: str
    saga_id: str
    name: str
    topic: str
    partition: int
    due_at: datetime
    # The trace context of the input that set the deadline, carried to its fired record.
    traceparent: str | None = None
    tracestate: str | None = None


@dataclass(slots=True)
class DeadlineRow:
    """One stored deadline, as the deadline table holds it.

    The one row type of the deadline table: the operator's commands list it, and the in-memory
    stores keep their table of it. Not frozen: the in-memory tables change a row in place, as
    the table's UPDATE does (a claim, a dispatch, a reset).

    Attributes:
        id: The deadline's id; a fired record names it.
        saga_type: Type of the saga that scheduled it.
        saga_id: Id of that saga instance.
        name: Deadline name, unique per saga instance.
        due_at: When it becomes due (database clock).
        payload: JSON form of the payload given at scheduling, or None.
        topic: Input topic its fired record is produced to.
        partition: Partition of that topic (the saga's own).
        dispatched_at: When a poller last produced its fired record, or None.
        dispatch_token: Lease token of that poller, or None.
    """

    id: str
    saga_type: str
    saga_id: str
    name: str
    due_at: datetime
    payload: Any
    topic: str
    partition: int
    dispatched_at: datetime | None = None
    dispatch_token: int | None = None

    def due(self) -> Due:
        """The row as the poller receives it from a claim."""
        return Due(
            self.id,
            self.saga_type,
            self.saga_id,
            self.name,
            self.topic,
            self.partition,
            self.due_at,
        )

    @property
    def ref(self) -> DeadlineRef:
        """The row as a batch loads it."""
        return DeadlineRef(
            self.saga_type, self.saga_id, self.name, self.due_at, self.payload, self.dispatch_token
        )

    @ref.setter
    def ref(self, ref: DeadlineRef) -> None:
        # A test dispatching a row by hand records the poller's token as a claim would.
        self.saga_type = ref.saga_type
        self.saga_id = ref.saga_id
        self.name = ref.name
        self.due_at = ref.due_at
        self.payload = ref.payload
        self.dispatch_token = ref.dispatch_token


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
    ) -> tuple[list[Due], float | None]:
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
