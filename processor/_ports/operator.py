"""The operator's ports: the stores behind the CLI's and the console's commands.

Parked sagas, deadlines, failed outbox rows, the audit trail and the inspection reads. The read
models they return live in :mod:`processor._ports.views` and :mod:`processor._ports.cluster`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, Unpack

from processor._engine.rows import AuditEntry, HeldMessage, Loaded, SagaRow, Wants, WriteSet
from processor._ports.deadlines import DeadlineRow
from processor._ports.views import (
    AuditFilters,
    AuditRow,
    DeadLetterRow,
    FailedRow,
    HeldRow,
    PendingDeadline,
    SagaSummary,
    TimelineEntry,
)


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

    Implemented by ``processor._postgres.reads.inspect.InspectQueries``.
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

    def dead_letter_of(self, message_id: str, within: timedelta) -> DeadLetterRow | None:
        """The dead letter of the record with this message id, written ``within`` ago at most."""
        ...

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

    def audit(self, **filters: Unpack[AuditFilters]) -> list[AuditRow]:
        """Operator actions newest first, narrowed by the filters given."""
        ...

    def batch_audit(self, batch: str, sagas: Sequence[tuple[str, str]]) -> list[AuditRow]:
        """The entries of an operator batch recorded for any of ``sagas`` (type, id) so far."""
        ...

    def list_sagas(
        self,
        *,
        saga_type: str | None = None,
        status: str | None = None,
        machine_state: str | None = None,
        older_than: timedelta | None = None,
        after: tuple[datetime, str, str] | None = None,
        limit: int = 50,
        outcome: str | None = None,
        correlation_id: str | None = None,
        state_contains: Sequence[Mapping[str, Any]] = (),
    ) -> list[SagaSummary]:
        """Sagas least recently changed first, filtered as `processor.ops._filters` reads them."""
        ...


@dataclass(frozen=True, slots=True)
class StoredSaga:
    """One non-ended saga row, as the check reads it."""

    saga_type: str
    saga_id: str
    state: dict[str, Any] | None
    state_version: int
    status: str
    machine_state: str | None
    parked_reason: str | None


class CheckSource(Protocol):
    """The reads the check needs from the processor's tables."""

    def schema_version(self) -> int:
        """The migration the schema is at (0: none)."""
        ...

    def unended_sagas(self) -> Iterable[StoredSaga]:
        """Every saga that has not ended."""
        ...

    def pending_deadlines(self) -> list[tuple[str, str, int]]:
        """(saga type, deadline name, count) of scheduled deadlines."""
        ...

    def parked_messages(self) -> list[tuple[str, str | None, str | None, int]]:
        """(saga type, message type, schema version, count) of held records."""
        ...

    def stored_partitions(self, group_id: str) -> dict[str, set[int]]:
        """Partitions per topic with stored offsets for ``group_id``."""
        ...

    def distribution(self) -> str | None:
        """Where the tables live on a Citus cluster, in words; None on a plain PostgreSQL."""
        ...

    def buckets(self) -> int | None:
        """The bucket count the tables are distributed by; None when they are not."""
        ...

    def node_problem(self) -> str | None:
        """On Citus, why the connection's node is not the one the schema's processes use."""
        ...


class ResumeStore(ParkedStore, OperatorStore, Protocol):
    """Lists parked sagas and retries them (the PostgreSQL `OperatorQueries` does both)."""
