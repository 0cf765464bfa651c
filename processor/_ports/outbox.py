"""The relay's ports: the outbox it publishes from and the failed outbox operators work."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TypedDict, Unpack

from processor._engine.records import OutboxRow
from processor._engine.rows import AuditEntry
from processor._ports.consumer import TP

FAILED_VALUE_PREVIEW = 64 * 1024


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


class FailedSelection(TypedDict, total=False):
    """Which failed outbox rows an operator's retry or discard takes: one saga, or one row.

    Attributes:
        saga_type: The saga's type (one saga: with ``saga_id``).
        saga_id: The saga's id.
        row_id: One row's id (instead of a saga).
        audit: The operator's entry, recorded in the same transaction when rows moved (see
            :meth:`AuditEntry.touching`).
    """

    saga_type: str | None
    saga_id: str | None
    row_id: int | None
    audit: AuditEntry | None


class FailedOutboxStore(Protocol):
    """The operator's side of the failed outbox. Each call is its own transaction.

    A selection (:class:`FailedSelection`) is either one saga or one row.
    """

    def list_failed(
        self, saga_type: str | None = None, saga_id: str | None = None, limit: int = 100
    ) -> list[FailedOutboxRow]:
        """Failed and held rows in id order, optionally of one saga (type, or type and id)."""
        ...

    def retry_failed(self, **selection: Unpack[FailedSelection]) -> list[FailedOutboxRow]:
        """Moves the selected rows back into the outbox under their own ids; returns them.

        A row id that belongs to a saga selects every failed and held row of that saga, so
        that its rows are published again in their original order.
        """
        ...

    def discard_failed(self, **selection: Unpack[FailedSelection]) -> list[FailedOutboxRow]:
        """Deletes the selected rows for good; returns them."""
        ...


class OutboxStore(Protocol):
    """The relay's side of the store.

    Attributes:
        more_waiting: After a claim: rows it left for another round were waiting (a store that
            claims one place's rows at a time: tables distributed by bucket over several
            workers), so the relay goes on at once rather than waiting for a wake-up.
    """

    more_waiting: bool

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

    def expect(self, partitions: Collection[TP] | None) -> None:
        """Rows of ``partitions`` were just committed (None: rows anywhere, or not known).

        A store that claims one place's rows at a time looks at theirs next, and after that
        round at no other place until told or woken again. Called from any thread.
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
