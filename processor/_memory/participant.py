"""The participant kit's store in memory, for unit tests and examples without a database.

A transaction works on a copy of the tables and publishes it on a normal exit, so a handler
that raises leaves nothing behind, as in PostgreSQL. Handlers get a :class:`RecordingSql` that
keeps the statements it was given and returns no rows.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from processor._engine.records import OutboxRow
from processor._ports.participant import Claim, InboxEntry, Rows

__all__ = ["MemoryParticipantStore", "RecordingSql"]

TP = tuple[str, int]


class _NoRows:
    rowcount = 0

    def fetchone(self) -> tuple[Any, ...] | None:
        return None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return []


@dataclass
class RecordingSql:
    """:class:`processor._ports.participant.Sql` that records statements and returns no rows."""

    statements: list[tuple[str, Any]] = field(default_factory=list)

    def execute(self, query: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Rows:
        self.statements.append((query, params))
        return _NoRows()


@dataclass
class _Tables:
    inbox: dict[str, InboxEntry] = field(default_factory=dict)
    outbox: list[OutboxRow] = field(default_factory=list)
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    statements: list[tuple[str, Any]] = field(default_factory=list)


class _Tx:
    def __init__(self, tables: _Tables) -> None:
        self.tables = tables
        self.sql = RecordingSql(tables.statements)

    def bucket_of(self, message_id: str) -> int:
        # One database, one bucket: a handler that writes it runs the same on tables by bucket.
        return 0

    def claim(
        self,
        message_id: str,
        message_type: str,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None = None,
    ) -> InboxEntry | None:
        seen = self.tables.inbox.get(message_id)
        if seen is None:
            self.tables.inbox[message_id] = InboxEntry(message_id, "pending", ())
        return seen

    def claim_all(self, claims: Sequence[Claim]) -> dict[str, InboxEntry | None]:
        return {
            c.message_id: self.claim(c.message_id, c.message_type, c.topic, c.partition, c.offset)
            for c in claims
        }

    def finish(self, message_id: str, outcome: str, replies: Sequence[OutboxRow]) -> None:
        self.tables.inbox[message_id] = InboxEntry(message_id, outcome, tuple(replies))
        self.publish(replies)

    def publish(self, rows: Sequence[OutboxRow]) -> None:
        self.tables.outbox.extend(rows)

    def advance(self, group_id: str, topic: str, partition: int, next_offset: int) -> None:
        key = (group_id, topic, partition)
        self.tables.offsets[key] = max(self.tables.offsets.get(key, 0), next_offset)


class MemoryParticipantStore:
    """:class:`processor._ports.participant.ParticipantStore` in memory.

    Attributes:
        tables: The committed state: ``inbox``, ``outbox`` (rows never removed), ``offsets`` and
            the ``statements`` handlers ran.
        commits: Transactions committed.
    """

    def __init__(self) -> None:
        self.tables = _Tables()
        self.commits = 0

    def positions(self, group_id: str, partitions: Sequence[TP]) -> Mapping[TP, int | None]:
        return {(t, p): self.tables.offsets.get((group_id, t, p)) for t, p in partitions}

    @contextmanager
    def transaction(self) -> Iterator[_Tx]:
        work = copy.deepcopy(self.tables)
        yield _Tx(work)
        self.tables = work
        self.commits += 1

    def close(self) -> None:
        pass
