"""The ports: what the runtime loops need from the outside world, as Protocols.

The loops (``processor.runtime``) and the operator services (``processor.ops``) speak only to
these. ``processor.postgres`` and
``processor.kafka`` implement them over the real clients; ``processor.memory`` implements them in
memory for unit tests and the saga fixture. One contract suite (``tests/contract``) runs the
same cases against both sets.

Every method raises only the runtime failures of :mod:`processor.errors`
(``Retryable``, ``CommitInDoubt``, ``Fenced``, ``RecordDataError``, ``DeliveryFailed``), never a
driver's own exception, so a loop decides what to do from the failure class alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from processor.engine.growth import GrowthState
from processor.engine.records import OffsetCommit, OutboxRow, Record
from processor.engine.rows import AuditEntry, HeldMessage, Loaded, SagaRow, Wants, WriteSet
from processor.errors import SendFailure
from processor.ops.views import (
    AuditRow,
    DeadLetterRow,
    FailedRow,
    HeldRow,
    PendingDeadline,
    SagaSummary,
    TimelineEntry,
)

__all__ = [
    "FAILED_VALUE_PREVIEW",
    "TP",
    "BatchStore",
    "DeadlineRow",
    "DeadlineStore",
    "Due",
    "FailedOutboxRow",
    "FailedOutboxStore",
    "GrowthStore",
    "HeldMessage",
    "InspectStore",
    "OperatorStore",
    "OutboxEntry",
    "OutboxStore",
    "ParkedSaga",
    "ParkedStore",
    "Purge",
    "RecordConsumer",
    "RecordProducer",
    "RetentionStore",
    "SetAside",
    "StateCount",
    "TopicMetadata",
    "WakeSource",
]

TP = tuple[str, int]
"""A (topic, partition) pair."""

FAILED_VALUE_PREVIEW = 64 * 1024
"""Most bytes of a value a failed outbox row shows (:attr:`FailedOutboxRow.row`).

A dead letter keeps its whole input value (2 MB and more), so listing or moving a saga's failed
rows with their values could load gigabytes; a retry moves the value in the store instead.
"""

Positions = dict[TP, tuple[int, int | None]]
"""Per partition: (owner epoch, next offset to read, or None when nothing was stored yet)."""


class BatchStore(Protocol):
    """The consumer's side of the store. Each call is its own transaction.

    After a broken connection the next call reconnects; the call that broke raises
    ``Retryable`` (or ``CommitInDoubt`` when the break came while committing).
    """

    def claim(self, partitions: Sequence[TP], owner: str) -> Positions:
        """Takes ownership: bumps each partition's epoch, so older owners' commits fail."""
        ...

    def read_offsets(self, partitions: Sequence[TP]) -> Positions:
        """The stored positions and epochs, as committed."""
        ...

    def load(self, wants: Wants) -> Loaded:
        """Reads every row the planner needs for one batch, with the database's clock."""
        ...

    def write(
        self,
        ws: WriteSet,
        offsets: Sequence[OffsetCommit],
        *,
        before_commit: Callable[[], None] | None = None,
        dry_run: bool = False,
    ) -> None:
        """Writes one planned batch and its offsets atomically.

        With ``dry_run`` everything is written and checked, then rolled back: it raises exactly
        what the real write would, and changes nothing.

        Raises:
            FencedOut: An offset's epoch or expected position moved; nothing is written.
            ConcurrentUpdate: A saga row's version moved; nothing is written.
            RecordDataError: The database refused some data; nothing is written.
            Retryable: The database is unreachable; nothing is written.
            CommitInDoubt: The connection broke during COMMIT; read the offsets to know.
        """
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One claimed outbox row: its id (commit order) and the record to publish.

    Attributes:
        id: The row's id; ids give the commit order.
        row: The record to publish.
        attempts: Earlier rounds in which this row failed with a transient error.
        behind: Id of a set-aside row of the same saga; when set, this row must not be sent but
            set aside behind it, so that nothing overtakes the failed row.
    """

    id: int
    row: OutboxRow
    attempts: int = 0
    behind: int | None = None


@dataclass(frozen=True, slots=True)
class SetAside:
    """A claimed row the relay moves to the failed outbox instead of publishing it.

    Attributes:
        id: The claimed row's id (kept: a retry puts the row back under it).
        reason: Why it failed, or which failed row it waits behind (never payload values).
        attempts: Rounds in which it was tried, this one included.
        held_behind: Id of the failed row of its saga it waits behind; None when it failed itself.
    """

    id: int
    reason: str
    attempts: int
    held_behind: int | None = None


@dataclass(frozen=True, slots=True)
class FailedOutboxRow:
    """A row in the failed outbox, as operators see it.

    Attributes:
        id: Its outbox id.
        row: The record that was not published; its value cut to the first
            :data:`FAILED_VALUE_PREVIEW` bytes (the outbox gets it whole back on a retry).
        value_bytes: The whole value's size in bytes.
        reason: Why it failed, or which row it waits behind.
        attempts: Rounds in which it was tried.
        held_behind: Id of the failed row of its saga it waits behind; None when it failed itself.
        created_at: When its batch committed it to the outbox.
        failed_at: When the relay set it aside.
    """

    id: int
    row: OutboxRow
    value_bytes: int
    reason: str
    attempts: int
    held_behind: int | None
    created_at: datetime
    failed_at: datetime


class FailedOutboxStore(Protocol):
    """The operator's side of the failed outbox. Each call is its own transaction.

    A selection is either one saga (``saga_type`` and ``saga_id``) or one row (``row_id``).
    """

    def list_failed(
        self, saga_type: str | None = None, saga_id: str | None = None, limit: int = 100
    ) -> list[FailedOutboxRow]:
        """Failed and held rows in id order, optionally of one saga (type, or type and id)."""
        ...

    def retry_failed(
        self,
        *,
        saga_type: str | None = None,
        saga_id: str | None = None,
        row_id: int | None = None,
        audit: AuditEntry | None = None,
    ) -> list[FailedOutboxRow]:
        """Moves the selected rows back into the outbox under their own ids; returns them.

        A row id that belongs to a saga selects every failed and held row of that saga, so
        that its rows are published again in their original order. ``audit``, when rows
        moved, is recorded in the same transaction (see :meth:`AuditEntry.touching`).
        """
        ...

    def discard_failed(
        self,
        *,
        saga_type: str | None = None,
        saga_id: str | None = None,
        row_id: int | None = None,
        audit: AuditEntry | None = None,
    ) -> list[FailedOutboxRow]:
        """Deletes the selected rows for good; returns them. ``audit`` as for a retry."""
        ...


class OutboxStore(Protocol):
    """The relay's side of the store."""

    def claim(
        self,
        limit: int,
        owned: Mapping[TP, int] | None = None,
        max_bytes: int | None = None,
    ) -> AbstractContextManager[list[OutboxEntry] | None]:
        """Claims up to ``limit`` committed rows in id order, as one transaction.

        A row caused by an input record carries its (topic, partition) as ``source``; it is
        claimed only for a partition in ``owned`` whose owner epoch is still the one given
        there, and a new owner's epoch bump waits for a claim in flight on the partition to end.
        Rows of no source are claimed by one relay at a time, across replicas. A partition row
        is not claimed while an older row of its saga from another source (another partition,
        or none) is still in the outbox, so a saga's commands keep their order across relays.

        Args:
            limit: Most rows claimed.
            owned: The partitions this replica owns, with the owner epoch it holds for each.
            max_bytes: A row is claimed only while the claimed rows before it hold fewer bytes
                of key and value than this (so the first always is); None: no bound.

        Yields None when nothing may be claimed: no partition given and another relay holds
        the rows of no source. Leaving the block normally removes the claimed rows, except those
        :meth:`settle` keeps or sets aside; leaving it with an exception puts them all back.
        """
        ...

    def settle(self, set_aside: Sequence[SetAside], kept: Mapping[int, str | None]) -> None:
        """Within an open claim, before leaving it: what becomes of the rows not published.

        Args:
            set_aside: Rows moved to the failed outbox, in the claim's transaction.
            kept: Rows that stay in the outbox for a later round, by id; a reason counts one
                more failed attempt for the row, None keeps it without counting (it waits
                behind a row of its saga that failed this round).
        """
        ...

    def close(self) -> None: ...


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


class WakeSource(Protocol):
    """Wake-ups from other processes (PostgreSQL LISTEN/NOTIFY in production)."""

    def run(self, stop: threading.Event, on_wake: Callable[[], None]) -> None:
        """Calls ``on_wake`` for each notification until ``stop`` is set; reconnects itself."""
        ...


class RecordProducer(Protocol):
    """Sends records to Kafka and waits for their acknowledgements."""

    def send(self, records: Sequence[OutboxRow], timeout: float) -> list[SendFailure]:
        """Produces every record in order and waits up to ``timeout`` for acknowledgements.

        Returns one failure per record that was not acknowledged (empty: all were). Raises
        ``Retryable`` when the client itself failed; it recreates itself for the next call.
        """
        ...

    def close(self, timeout: float) -> None: ...


class RecordConsumer(Protocol):
    """A consumer group member whose positions come from the store, not from Kafka."""

    def consume(self, max_records: int, timeout: float) -> list[Record]: ...

    def seek(self, tp: TP, offset: int | None) -> None: ...

    def pause(self, tps: Sequence[TP]) -> None: ...

    def resume(self, tps: Sequence[TP]) -> None: ...

    def leave(self) -> None:
        """Leaves the group: every partition goes back to the other members."""
        ...

    def rejoin(self) -> None:
        """Joins the group again after :meth:`leave`."""
        ...

    def commit_advisory(self, offsets: Mapping[TP, int]) -> None:
        """Mirrors stored positions to Kafka so lag tools work; the store stays the authority."""
        ...

    def ends(self) -> dict[TP, int]:
        """Partitions that reached their end since the last call, with the position there.

        The position is past any transaction markers and aborted records after the last record
        delivered, which no record's offset reaches.
        """
        ...

    def close(self) -> None: ...


# -- operator services -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadlineRow:
    """One stored deadline.

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
    dispatched_at: datetime | None
    dispatch_token: int | None


@dataclass(frozen=True, slots=True)
class StateCount:
    """Sagas of one type in one machine state.

    Attributes:
        saga_type: Saga type name.
        machine_state: The machine state.
        count: How many instances are in it.
        oldest: Longest time an instance has been in it (database clock).
    """

    saga_type: str
    machine_state: str
    count: int
    oldest: timedelta


@dataclass(frozen=True, slots=True)
class ParkedSaga:
    """A parked saga instance.

    Attributes:
        saga_type: The saga's type name.
        saga_id: The instance id (its association value).
        reason: The error that parked it: handler name, exception type and message.
        held: How many messages wait behind it, the failed one included.
        version: The instance's version; a retry checks it has not moved.
        parked_at: When the instance row last changed.
    """

    saga_type: str
    saga_id: str
    reason: str | None
    held: int
    version: int
    parked_at: datetime


class OperatorStore(Protocol):
    """Read-only views for operators. Every time is the database's clock."""

    def pending_deadlines(self, saga_type: str, saga_id: str) -> list[DeadlineRow]:
        """Deadlines still scheduled for one saga instance, soonest first."""
        ...

    def overdue_deadlines(self, now: datetime | None, limit: int) -> list[DeadlineRow]:
        """Up to ``limit`` deadlines due at or before ``now``, oldest due first.

        ``now`` None means the database's clock, the one the poller uses.
        """
        ...

    def machine_states(self, saga_type: str | None) -> list[StateCount]:
        """State machine sagas per (type, machine state), ordered by both; None: every type."""
        ...

    def parked_sagas(self, limit: int) -> list[ParkedSaga]:
        """Up to ``limit`` parked saga instances, longest parked first."""
        ...


class ParkedStore(Protocol):
    """What a retry of a parked saga needs, all inside one transaction."""

    def transaction(self) -> AbstractContextManager[None]:
        """One transaction; leaving it with an exception undoes every call made inside it."""
        ...

    def lock_saga(self, saga_type: str, saga_id: str) -> SagaRow | None:
        """The saga's row (without its parked reason), locked until the transaction ends.

        A consumer batch that touches the saga waits for the lock; its version check then fails
        and it replans against the saga as the retry left it. None when there is no such row.
        """
        ...

    def held_messages(self, saga_type: str, saga_id: str) -> list[HeldMessage]:
        """The records held behind the saga, in arrival order."""
        ...

    def load(self, wants: Wants) -> Loaded:
        """Reads every row the planner needs, as ``BatchStore.load`` does."""
        ...

    def release_held(self, parked_ids: Sequence[int]) -> None:
        """Deletes these held records."""
        ...

    def discard_saga(self, saga_type: str, saga_id: str, version: int) -> None:
        """Deletes the saga's row if it is still at ``version``."""
        ...

    def write(self, ws: WriteSet) -> None:
        """Writes a planned batch without offsets.

        Raises:
            ConcurrentUpdate: A saga row's version moved.
        """
        ...


class InspectStore(Protocol):
    """What `show`, the saga lists, the dead-letter commands and the console read.

    Implemented by ``processor.postgres.inspect.InspectQueries``.
    """

    def saga(self, saga_type: str, saga_id: str) -> tuple[SagaSummary, dict[str, Any] | None]:
        """The saga's row and state; raises LookupError when there is none."""
        ...

    def timeline(
        self, saga_type: str, saga_id: str, after: int = 0, limit: int = 1000
    ) -> list[TimelineEntry]: ...

    def deadlines(self, saga_type: str, saga_id: str) -> list[PendingDeadline]: ...

    def held(self, saga_type: str, saga_id: str) -> list[HeldRow]: ...

    def failed(self, saga_type: str, saga_id: str) -> list[FailedRow]: ...

    def input_partition(self, saga_type: str, saga_id: str) -> tuple[str, int] | None: ...

    def dead_letter(self, row_id: int) -> tuple[DeadLetterRow, bytes | None, bytes | None]: ...

    def purge_dead_letters(
        self,
        ids: Sequence[int] | None = None,
        older_than: timedelta | None = None,
        audit: AuditEntry | None = None,
    ) -> int:
        """Deletes the selected dead letters, recording ``audit`` with them if any went."""
        ...

    def record_audit(self, entry: AuditEntry) -> None:
        """Records one operator action on its own."""
        ...

    def audit(
        self,
        *,
        since: timedelta | None = None,
        saga_type: str | None = None,
        saga_id: str | None = None,
        action: str | None = None,
        limit: int = 100,
    ) -> list[AuditRow]:
        """Operator actions newest first, narrowed by the filters given."""
        ...


class Purge(StrEnum):
    """The kinds of rows retention deletes, in the order a round deletes them."""

    ENDED_HISTORY = "ended-history"
    """History rows of sagas that ended long enough ago, a chunk of rows at a time."""
    ENDED_SAGAS = "ended-sagas"
    """Ended sagas whose history is gone, by end time; a tombstone of each is kept."""
    HISTORY = "history"
    """History rows that did not apply a message (duplicates, ignored, parked), by time; none
    of a saga that is still running (its audit trail)."""
    APPLIED = "applied"
    """Every history row past the dedupe window, the applied ones (message-id dedupe) too;
    none of a saga that is still running (its message ids must stay duplicates)."""
    TOMBSTONES = "tombstones"
    """Tombstones past the dedupe window, by the saga's end time."""
    DEAD_LETTERS = "dead-letters"
    """Dead-letter rows, by time."""
    PARKED = "parked-messages"
    """Held messages of sagas that are no longer parked, by time."""
    FAILED_OUTBOX = "failed-outbox"
    """Failed and held outbox rows, by when they were set aside."""


class RetentionStore(Protocol):
    """What the retention loop needs: one short, chunked delete per call.

    Each call is its own transaction and holds a lock that only one replica's retention can
    hold at a time; a call that finds it taken does nothing and returns None.
    """

    def purge(self, what: Purge, older_than: timedelta, limit: int) -> int | None:
        """Deletes up to ``limit`` of the oldest rows of one kind older than ``older_than``.

        Args:
            what: The kind of rows.
            older_than: Age by the store's clock (the database's), measured from when the row
                ended, was written, or was set aside.
            limit: Most rows (for ended sagas: sagas) deleted in this call.

        Returns:
            How many were deleted; None when another replica's retention holds the lock.

        Raises:
            Retryable: The store is unreachable, or a lock was not granted in time.
        """
        ...

    def close(self) -> None: ...


class GrowthStore(Protocol):
    """What the growth watch keeps in the store: known partition counts and growths.

    Every write is conditional, so replicas that notice the same growth together record it
    once; every time is the store's clock (the database's).
    """

    def load(self, group_id: str) -> GrowthState:
        """The group's known counts and recorded growths, with the store's clock."""
        ...

    def baseline(self, group_id: str, topic: str, count: int) -> None:
        """Records ``count`` for a topic the group knows no count for yet (else nothing)."""
        ...

    def grow(self, group_id: str, topic: str, old_count: int, new_count: int) -> bool:
        """Records a growth from ``old_count`` (still the known count) to ``new_count``.

        Returns False when the known count is no longer ``old_count`` (another replica recorded
        it first).
        """
        ...

    def committed(self, group_id: str, topics: Sequence[str]) -> dict[TP, int | None]:
        """The group's committed next offset of every partition it stored one for."""
        ...

    def close(self) -> None: ...


class TopicMetadata(Protocol):
    """Partition counts and high watermarks, straight from the cluster."""

    def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        """Each existing topic's partition count (missing topics are left out).

        Raises:
            Retryable: The cluster did not answer in time.
        """
        ...

    def high_watermarks(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        """The high watermark of each of ``partitions``, asked of the brokers now.

        Raises:
            Retryable: A broker did not answer in time.
        """
        ...

    def close(self) -> None: ...
