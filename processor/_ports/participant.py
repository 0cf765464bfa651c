"""What the participant kit needs from a database, as Protocols; adapters live elsewhere.

Only :mod:`processor._postgres` implements these over a driver. A handler sees :class:`Sql`, the
service's own connection inside the command's transaction, never a driver type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from processor._engine.records import OutboxRow

__all__ = ["InboxEntry", "ParticipantStore", "ParticipantTx", "Rows", "Sql"]

TP = tuple[str, int]


class Rows(Protocol):
    """The result of one statement."""

    @property
    def rowcount(self) -> int:
        """Rows the statement changed or returned."""
        ...

    def fetchone(self) -> tuple[Any, ...] | None:
        """The next row, or None."""
        ...

    def fetchall(self) -> list[tuple[Any, ...]]:
        """Every remaining row."""
        ...


class Sql(Protocol):
    """The service's database connection, inside the command's transaction.

    Statements use ``%s`` placeholders. Whatever a handler writes commits together with the
    command's inbox row and its replies, or not at all. A driver error surfaces as a
    :class:`processor._errors.RuntimeFailure` subclass: ``Retryable`` (the command is tried
    again later), ``RecordDataError`` (the command is dead-lettered), other (the service stops).
    """

    def execute(self, query: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Rows:
        """Runs one statement and returns its rows."""
        ...


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """A command seen before: how it ended and the replies it produced.

    Attributes:
        message_id: The command's message id.
        outcome: ``handled``, ``expired``, ``dropped`` or ``dead-lettered``.
        replies: The replies as first published (same message ids).
    """

    message_id: str
    outcome: str
    replies: tuple[OutboxRow, ...]


@dataclass(frozen=True, slots=True)
class Claim:
    """A command about to be handled: its message id, where it was read and its record key.

    The key (the saga key; the message id when the record has none) places the command's rows
    when the tables are distributed by bucket.
    """

    message_id: str
    message_type: str
    topic: str
    partition: int
    offset: int
    key: bytes | None = None


class ParticipantTx(Protocol):
    """The transaction of one command, or of a consumer batch of them."""

    @property
    def sql(self) -> Sql:
        """The connection for the handler's own statements."""
        ...

    def bucket_of(self, message_id: str) -> int:
        """The ``bucket`` value of the rows of the command claimed as ``message_id``.

        On tables distributed by bucket (``SAGA_DATABASE__DISTRIBUTED=buckets``) a service
        table with a ``bucket`` column is co-located with the inbox: a row written with the
        command's bucket, and read back by it, is on the worker that holds the command's inbox
        row, so the command's transaction stays there. It follows the command's key (the saga
        key), so every command of one saga has the same. 0 on other layouts.
        """
        ...

    def claim(
        self,
        message_id: str,
        message_type: str,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None = None,
    ) -> InboxEntry | None:
        """Inserts the inbox row; returns the earlier entry when the command was seen before.

        A concurrent transaction holding the same message id is waited for, so one of two
        replicas handling the same command sees the other's entry. ``key`` is the command's
        record key (see :class:`Claim`).
        """
        ...

    def claim_all(self, claims: Sequence[Claim]) -> dict[str, InboxEntry | None]:
        """:meth:`claim` of several commands at once, by message id; ids must not repeat.

        What a batch's commands cost in one round trip rather than one each; the answers are
        those their claims one after another would give.
        """
        ...

    def finish(self, message_id: str, outcome: str, replies: Sequence[OutboxRow]) -> None:
        """Stores the outcome and replies on the inbox row and queues the replies."""
        ...

    def publish(self, rows: Sequence[OutboxRow]) -> None:
        """Queues rows in the outbox (re-sent replies, dead letters)."""
        ...

    def advance(self, group_id: str, topic: str, partition: int, next_offset: int) -> None:
        """Moves the partition's stored position forward (never back)."""
        ...


class ParticipantStore(Protocol):
    """The participant's tables: positions, and transactions of one or more commands."""

    def positions(self, group_id: str, partitions: Sequence[TP]) -> Mapping[TP, int | None]:
        """The stored next offset of each partition (None: start from the beginning)."""
        ...

    def transaction(self) -> AbstractContextManager[ParticipantTx]:
        """One transaction; it commits when the block ends normally.

        Raises:
            Retryable: The database is unreachable or the connection broke.
            RecordDataError: The data was refused (the block's work is rolled back).
            RuntimeFailure: Any other database error.
        """
        ...

    def close(self) -> None:
        """Releases the connection."""
        ...
