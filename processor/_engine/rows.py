"""The shapes the pure engine reads and writes.

Loaded rows, planned writes, and the status and outcome values that the store spells the same
way in its tables.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from processor._engine.records import OutboxRow, Record


class SagaStatus(StrEnum):
    """Lifecycle of a saga instance, as stored in ``saga_instance.status``."""

    ACTIVE = "active"
    ENDED = "ended"
    PARKED = "parked"


ACTIVE = SagaStatus.ACTIVE
ENDED = SagaStatus.ENDED
PARKED = SagaStatus.PARKED


class Outcome(StrEnum):
    """What one input record did to one saga, as stored in ``saga_history.outcome``."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    PARKED = "parked"
    PARKED_BEHIND = "parked-behind"
    IGNORED_ENDED = "ignored-ended"
    NO_SAGA = "no-saga"
    DEADLINE_STALE = "deadline-stale"
    DEADLINE_NO_HANDLER = "deadline-no-handler"  # older rows only: such a fire now parks
    DEADLINE_REJECTED = "deadline-rejected"
    # An operator record that could not apply (e.g. a retry of a saga that is not parked).
    OPERATOR_REFUSED = "operator-refused"
    # A held message an operator dropped instead of replaying (`parked skip`).
    SKIPPED = "skipped"
    # An applied input an operator's reset ran again (`saga reset`); the input's first row
    # stays `applied`, the duplicate detector.
    REPLAYED = "replayed"


DECIDED = frozenset(
    {
        Outcome.APPLIED,
        Outcome.NO_SAGA,
        Outcome.IGNORED_ENDED,
        Outcome.OPERATOR_REFUSED,
        Outcome.SKIPPED,
    }
)
"""Outcomes that decide an operator record for good: a copy of it is then a duplicate.

Not only ``applied``: a signed request refused, or sent before its saga existed, must not be
decided again when someone sends its bytes again later. A record held behind a parked saga
(``parked-behind``, ``parked``) is not decided yet: a retry replays it. Retention purges the
rows that applied nothing after ``SAGA_RETENTION__HISTORY`` (days), far longer than an operator
record stays unexpired (``SAGA_OPERATOR__EXPIRY``, minutes): by the time such a row is gone, a
copy of its record is refused as expired.
"""


SagaKey = tuple[str, str]


@dataclass(slots=True)
class SagaRow:
    saga_type: str
    saga_id: str
    state: dict[str, Any] | None
    # None plans against the row as if the saga had not started: an operator's retry of a saga
    # whose start handler failed keeps the row (and its version) but has no state to run on.
    status: SagaStatus | None
    version: int
    parked_reason: str | None = None
    # The saga class's state version the JSON was written at (see processor._authoring.upcasting).
    state_version: int = 1


@dataclass(frozen=True, slots=True)
class DeadlineRef:
    saga_type: str
    saga_id: str
    name: str
    due_at: datetime
    payload: Any
    dispatch_token: int | None


@dataclass(frozen=True)
class Loaded:
    """Rows the planner needs, read in the batch's transaction."""

    sagas: Mapping[SagaKey, SagaRow]
    applied: AbstractSet[tuple[str, str, str]]
    deadlines: Mapping[str, DeadlineRef]
    lease_token: int | None
    now: datetime  # the database's clock, so deadlines and the poller agree on time
    # Wanted sagas that ended and whose rows retention purged: they count as ended, so a late
    # or redelivered start event is recorded and ignored, never starts a second saga.
    tombstones: AbstractSet[SagaKey] = frozenset()
    # For the sagas in ``Wants.held_keys``: the records held behind each, in arrival order.
    # Their deadline rows are in ``deadlines`` too, for the held fired deadlines.
    held: Mapping[SagaKey, Sequence[HeldMessage]] = field(default_factory=dict)
    # Of ``Wants.operator_keys``: the operator records already decided (an outcome in
    # ``DECIDED``, not only applied); a copy of one is a duplicate.
    decided: AbstractSet[tuple[str, str, str]] = frozenset()
    # For the sagas in ``Wants.history_keys``: their applied and replayed inputs, oldest first.
    # Their deadline rows are in ``deadlines`` too.
    history: Mapping[SagaKey, Sequence[PastInput]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PastInput:
    """One input a saga applied, as its history row keeps it, for an operator's reset."""

    message_id: str
    message_type: str
    kind: str
    outcome: str
    version: int | None
    topic: str | None
    partition: int | None
    offset: int | None
    headers: Mapping[str, str] | None
    payload: bytes | None
    effects: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class HeldMessage:
    """A record held behind a parked saga: its ``parked_message`` row id and the record."""

    parked_id: int
    record: Record


@dataclass(frozen=True)
class Wants:
    saga_keys: set[SagaKey]
    message_keys: set[tuple[str, str, str]]
    deadline_ids: set[str]
    # Parked sagas an operator's retry in this batch replays: load their held records.
    held_keys: set[SagaKey] = field(default_factory=set)
    # The batch's operator records (saga type, saga id, message id): load those decided
    # whatever their outcome. A statement of its own, run only for a batch that holds one.
    operator_keys: set[tuple[str, str, str]] = field(default_factory=set)
    # Sagas an operator's reset in this batch rebuilds: load their history and deadlines.
    history_keys: set[SagaKey] = field(default_factory=set)


@dataclass(slots=True)
class SagaWrite:
    saga_type: str
    saga_id: str
    state: dict[str, Any] | None
    status: SagaStatus
    version: int
    expected_version: int | None  # None: the row is new
    parked_reason: str | None
    # The queryable `machine_state` column: a state machine's current state while the saga
    # runs (None for other sagas), how it ended once it has (a SagaOutcome).
    machine_state: str | None = None
    state_version: int = 1


# Not frozen: a frozen dataclass sets each field through object.__setattr__ (about 0.1 us a
# field), and one is built per event; nothing changes it once built.
@dataclass(slots=True)
class HistoryRow:
    saga_type: str
    saga_id: str
    message_id: str
    message_type: str
    kind: str
    outcome: Outcome
    version: int | None
    topic: str
    partition: int
    offset: int
    detail: str | None = None
    # The audit trail (see `history.payload`): the record's headers and value as received (the
    # value's bytes are the record's own, never re-encoded), or the value's SHA-256 only.
    headers: Mapping[str, str] | None = None
    payload: bytes | None = None
    payload_sha256: bytes | None = None
    # What the step produced: commands (message id, type, topic) and deadline operations.
    effects: Mapping[str, Any] | None = None


# Not frozen: a frozen dataclass sets each field through object.__setattr__ (about 0.1 us a
# field), and one is built per event; nothing changes it once built.
@dataclass(slots=True)
class DeadlineInsert:
    """One deadline a batch schedules: the deadline table's row, before any poller claimed it.

    :class:`processor._ports.DeadlineRow` is the stored row: these fields and its dispatch.

    Attributes:
        id: The deadline's id; a fired record names it.
        saga_type: Type of the saga that scheduled it.
        saga_id: Id of that saga instance.
        name: Deadline name, unique per saga instance.
        due_at: When it becomes due (database clock).
        payload: JSON form of the payload given at scheduling, or None.
        topic: Input topic its fired record is produced to.
        partition: Partition of that topic (the saga's own).
        traceparent: The W3C trace context of the input that set it, for its fired record.
        tracestate: The W3C trace state sent with it.
    """

    id: str
    saga_type: str
    saga_id: str
    name: str
    due_at: datetime
    payload: Any
    topic: str
    partition: int
    traceparent: str | None = None
    tracestate: str | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    record: Record
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class ParkedMessage:
    saga_type: str
    saga_id: str
    record: Record
    reason: str
    # The code error that parked the saga, for the log's traceback; never stored.
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One operator action for the audit table, written in the transaction of its effect.

    Attributes:
        actor: Who asked: the operator's name the request carries.
        action: What was asked: an operator record's action (``terminate``, ``parked-skip``,
            ...), ``dead-letter-replay``, ``dead-letter-purge``, ``outbox-retry`` or
            ``outbox-discard``.
        reason: Why, in the operator's words.
        saga_type: The saga acted on, when the action concerns one.
        saga_id: Its id.
        target: What was touched, as JSON: ids and counts. A store adds the ids it changed.
        outcome: How it ended: a history outcome (``applied``, ``operator-refused``, ...) for
            an operator record; ``replayed``, ``purged``, ``retried``, ``discarded`` otherwise.
    """

    actor: str
    action: str
    reason: str | None
    saga_type: str | None = None
    saga_id: str | None = None
    target: Mapping[str, Any] = field(default_factory=dict)
    outcome: str = "applied"

    def touching(
        self, ids: Sequence[int], sagas: AbstractSet[tuple[str | None, str | None]] = frozenset()
    ) -> AuditEntry:
        """This entry with the rows an action changed: their count and (the first) ids.

        A purge may take millions of rows; the entry keeps their count and the first
        :data:`AUDIT_IDS` ids, in order. ``sagas`` are the rows' sagas: an entry naming no
        saga takes theirs when they all belong to one (a row picked by its id).
        """
        ordered = sorted(ids)
        target = {**self.target, "count": len(ordered), "ids": ordered[:AUDIT_IDS]}
        entry = replace(self, target=target)
        if self.saga_type is None and len(sagas) == 1:
            [(saga_type, saga_id)] = sagas
            entry = replace(entry, saga_type=saga_type, saga_id=saga_id)
        return entry


AUDIT_IDS = 1000
"""Most row ids an audit entry lists (its count covers them all)."""


@dataclass
class WriteSet:
    sagas: list[SagaWrite] = field(default_factory=list)
    history: list[HistoryRow] = field(default_factory=list)
    outbox: list[OutboxRow] = field(default_factory=list)
    deadline_clears: list[SagaKey] = field(default_factory=list)
    deadline_deletes: list[tuple[str, str, str]] = field(default_factory=list)
    deadline_inserts: list[DeadlineInsert] = field(default_factory=list)
    # (deadline id, token): rows whose fired record was consumed without effect while they
    # were still dispatched under that token; they become due again for the current leader.
    deadline_resets: list[tuple[str, int]] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    parked: list[ParkedMessage] = field(default_factory=list)
    # (saga type, saga id, name): deadlines an operator asked to fire now.
    deadline_fire_now: list[tuple[str, str, str]] = field(default_factory=list)
    # Wake the deadline poller even without new deadlines (a parked saga's retry).
    wake_deadlines: bool = False
    # Ids of held records an operator's retry replayed (or skipped): deleted with the batch.
    held_releases: list[int] = field(default_factory=list)
    # Operator actions this batch decided, for the audit table (written with their effects).
    audit: list[AuditEntry] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    # Sagas this batch ended, by (saga type, outcome): the saga_ended_total metric.
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    # Sagas this batch handed to a person, by (saga type, kind): saga_escalations_total.
    escalations: Counter[tuple[str, str]] = field(default_factory=Counter)

    def extend(self, other: WriteSet) -> None:
        """Adds the rows and counts of ``other`` (a trial planned on its own) to these."""
        for f in fields(WriteSet):
            value = getattr(other, f.name)
            if isinstance(value, list):
                getattr(self, f.name).extend(value)
        self.counts.update(other.counts)
        self.outcomes.update(other.outcomes)
        self.escalations.update(other.escalations)

    def wakes_poller(self, soon: datetime | None = None) -> bool:
        """Whether the deadline poller should look now rather than at its next planned time.

        It sleeps until the next due deadline, at most its polling interval. A new deadline due
        later than ``soon`` (now plus that interval) is found on time by the next planned look;
        waking it for every batch of such deadlines would cost a lease and a claim query per
        batch. None: any new deadline wakes it.
        """
        if self.deadline_resets or self.wake_deadlines:
            return True
        if soon is None:
            return bool(self.deadline_inserts)
        return any(d.due_at <= soon for d in self.deadline_inserts)
