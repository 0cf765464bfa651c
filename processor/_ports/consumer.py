"""The consumer's ports: what the loops need from the outside world, as Protocols.

The consumer loop's store and Kafka, retention and the growth watch; the relay's and the poller's
ports are in :mod:`processor._ports.outbox` and :mod:`processor._ports.deadlines`.

``processor._postgres`` and ``processor._kafka`` implement them over the real clients;
``processor._memory`` implements them in memory for unit tests and the saga fixture. One contract
suite (``tests/contract``) runs the same cases against both sets.

Every method raises only the runtime failures of :mod:`processor._errors`
(``Retryable``, ``CommitInDoubt``, ``Fenced``, ``RecordDataError``, ``DeliveryFailed``), never a
driver's own exception, so a loop decides what to do from the failure class alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from enum import StrEnum
from typing import Protocol

from processor._engine.growth import GrowthState
from processor._engine.records import OffsetCommit, OutboxRow, Record
from processor._engine.rows import Loaded, Wants, WriteSet
from processor._errors import SendFailure

TP = tuple[str, int]
"""A (topic, partition) pair."""

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
