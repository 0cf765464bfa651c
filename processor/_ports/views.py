"""What an operator sees of sagas: one saga in full, saga lists, dead letters, the overview.

Pure shapes plus their JSON form (`jsonable`), shared by the CLI's `--json` output and the web
console, so both show the same data.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, TypedDict

__all__ = [
    "AUDIT_LIMIT",
    "AuditFilters",
    "AuditRow",
    "DeadLetterRow",
    "FailedRow",
    "FunctionJournal",
    "HeldRow",
    "JournalEntry",
    "Overview",
    "PendingAwait",
    "PendingDeadline",
    "SagaSummary",
    "SagaView",
    "TimelineEntry",
    "TypeStatusCount",
    "jsonable",
    "payload_text",
]


@dataclasses.dataclass(frozen=True, slots=True)
class SagaSummary:
    """One saga instance's row, without its state.

    Attributes:
        saga_type: The saga's type.
        saga_id: The saga's id.
        status: `active`, `parked` or `ended`.
        machine_state: The state machine state, for state machine sagas.
        since: When it entered that machine state (or last changed, for other sagas).
        version: The instance version.
        created_at: When it started.
        updated_at: When it last changed.
        parked_reason: Why it is parked.
    """

    saga_type: str
    saga_id: str
    status: str
    machine_state: str | None
    since: datetime
    version: int
    created_at: datetime
    updated_at: datetime
    parked_reason: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One history row: what one input record did to the saga, and what it produced.

    Attributes:
        id: The history row's id (the timeline's order).
        at: When it was written.
        kind: `event`, `deadline` or `operator`.
        message_id: The record's message id.
        message_type: Its wire type, `deadline:<name>` or `operator:<action>`.
        outcome: `applied`, `duplicate`, `parked`, `ignored-ended`, `deadline-stale`, ...
        version: The version it produced, when it applied or parked.
        topic: Where it was consumed from.
        partition: Its partition.
        offset: Its offset.
        detail: The handler that ran, the park reason, or who asked and why.
        headers: The record's headers, when the history keeps them.
        payload: The record's value as text (or base64 for binary), when kept in full.
        payload_sha256: The value's SHA-256 in hex, when the history keeps hashes.
        effects: Commands sent and deadlines scheduled or cancelled by this step.
    """

    id: int
    at: datetime
    kind: str
    message_id: str
    message_type: str
    outcome: str
    version: int | None
    topic: str | None
    partition: int | None
    offset: int | None
    detail: str | None
    headers: dict[str, str] | None
    payload: str | None
    payload_sha256: str | None
    effects: dict[str, Any] | None


@dataclasses.dataclass(frozen=True, slots=True)
class HeldRow:
    """A message parked behind a parked saga."""

    id: int
    message_id: str | None
    message_type: str | None
    topic: str
    partition: int
    offset: int
    reason: str
    created_at: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class FailedRow:
    """An outbox row the relay set aside (or held behind one)."""

    id: int
    message_id: str | None
    topic: str
    reason: str
    attempts: int
    held_behind: int | None
    failed_at: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class PendingDeadline:
    """A deadline still scheduled."""

    id: str
    name: str
    due_at: datetime
    dispatched_at: datetime | None
    # The deadline's payload (the orchestrator's step timer says its step and attempt).
    payload: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class AuditRow:
    """One operator action from the audit table: who, when, why, what, and how it ended.

    Attributes:
        id: The row's id (the order the actions were recorded in).
        at: When it was recorded (with its effect, in the same transaction).
        actor: Who asked.
        action: What was asked (see `processor._engine.rows.AuditEntry`).
        reason: Why.
        saga_type: The saga acted on, if one.
        saga_id: Its id.
        target: Ids and counts of what was touched.
        outcome: How it ended.
    """

    id: int
    at: datetime
    actor: str
    action: str
    reason: str | None
    saga_type: str | None
    saga_id: str | None
    target: dict[str, Any]
    outcome: str


AUDIT_LIMIT = 100
"""How many entries an audit listing returns when its filters give no ``limit``."""


class AuditFilters(TypedDict, total=False):
    """The filters of an audit listing (``InspectStore.audit``); each one given narrows it.

    Attributes:
        since: Only entries recorded at most this long ago.
        saga_type: Only entries about sagas of this type.
        saga_id: Only entries about sagas with this id.
        action: Only entries of this action.
        limit: At most this many entries, the newest; :data:`AUDIT_LIMIT` when not given.
        batch: Only entries of this operator batch (their target's ``batch``).
    """

    since: timedelta | None
    saga_type: str | None
    saga_id: str | None
    action: str | None
    limit: int
    batch: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class SagaView:
    """Everything known about one saga instance, for `show` and the console's detail page."""

    saga: SagaSummary
    state: dict[str, Any] | None
    deadlines: list[PendingDeadline]
    parked_messages: list[HeldRow]
    failed_outbox: list[FailedRow]
    timeline: list[TimelineEntry]
    # The operator actions recorded for the saga, oldest first.
    audit: list[AuditRow] = dataclasses.field(default_factory=list)
    # An orchestrated saga's step in flight: its attempt, what is due next, its last failure.
    step: StepProgress | None = None
    # A saga function's journal: its resolved awaits, and the one it is suspended on.
    journal: FunctionJournal | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class StepProgress:
    """Where an orchestrated saga's step stands, from its progress and its step timer.

    Attributes:
        step: The step in flight (or whose undo is), None when none is but a failure is kept.
        phase: ``forward``, or ``undo`` while its compensation runs.
        attempt: The attempt made last (1-based; 0 when none was).
        waiting: What the step timer waits for: ``timeout`` (a reply to that attempt),
            ``retry`` (backing off before the next attempt), ``resume`` (an open breaker),
            ``late`` (a late success) or ``escalated`` (a person); None without a timer.
        due_at: When that timer fires: the next attempt, or the attempt's timeout.
        next_attempt: The attempt the timer's firing sends, if it sends one.
        last_failure: The last failure the saga's progress keeps, if any.
    """

    step: str | None
    phase: str
    attempt: int
    waiting: str | None
    due_at: datetime | None
    next_attempt: int | None
    last_failure: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class JournalEntry:
    """One resolved await of a saga function (or a send, a patch marker), without payloads.

    Attributes:
        seq: Its place in the journal, from 0.
        kind: ``call``, ``undo``, ``send``, ``sleep``, ``wait``, ``decision`` or ``patch``.
        what: Its label: the command's or event's wire name, the patch's name.
        outcome: ``ok``, ``rejected``, ``failed``, ``timed-out``, ``cancelled``, ``deadline``
            or ``decided``.
        attempts: The attempts a call took.
        at: When it resolved.
        reply: The wire name of the reply or event that resolved it, if one did.
        decision: A person's decision, for a decision.
    """

    seq: int
    kind: str
    what: str
    outcome: str
    attempts: int
    at: datetime | None
    reply: str | None
    decision: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class PendingAwait:
    """The await a saga function is suspended on.

    Attributes:
        seq: The journal place it takes once resolved.
        kind: As :attr:`JournalEntry.kind`.
        what: Its label.
        attempt: The attempt in flight, from 1.
        max_attempts: How many its retry policy allows, if it has one.
        since: When it was issued.
        timeout: How long each attempt waits; None waits for ever (or the saga deadline).
        timer_at: When its timer fires: the attempt's timeout, the next attempt, the sleep's end.
        backing_off: The timer is the pause before attempt ``attempt + 1``.
        expects: Wire names of the events that resolve it well.
        reason: Why a person is asked, for a decision.
    """

    seq: int
    kind: str
    what: str
    attempt: int
    max_attempts: int | None
    since: datetime | None
    timeout: timedelta | None
    timer_at: datetime | None
    backing_off: bool
    expects: list[str]
    reason: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class FunctionJournal:
    """What a saga function's state says of its course, for `show` and the console.

    Attributes:
        entries: Every resolved await, in order.
        pending: The await it is suspended on, if any.
        compensating: Its undos are running.
        aborted: Why they run (a refusal, a timeout, a cancel, the deadline).
        deadline_at: The saga's own deadline, if it has one.
        late: Events that came when nothing awaited them, and what was done about them.
    """

    entries: list[JournalEntry]
    pending: PendingAwait | None
    compensating: bool
    aborted: str | None
    deadline_at: datetime | None
    late: list[str]


def step_state(state: dict[str, Any] | None) -> str | None:
    """A saga's own name for where it is (``"CHARGING"``), if it has one.

    An orchestrated saga's ``progress.state``, or the ``state_label`` field a plain saga may
    declare.
    """
    stored = state or {}
    progress = stored.get("progress")
    value = progress.get("state") if isinstance(progress, dict) else stored.get("state_label")
    return value if isinstance(value, str) else None


@dataclasses.dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """A record that could never be handled, and why."""

    id: int
    topic: str
    partition: int
    offset: int
    reason: str
    detail: str | None
    message_id: str | None
    message_type: str | None
    created_at: datetime
    key: str | None = None
    value: str | None = None
    headers: dict[str, str] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TypeStatusCount:
    """How many sagas of a type are in a status, and the age of the least recently changed."""

    saga_type: str
    status: str
    count: int
    oldest: timedelta


@dataclasses.dataclass(frozen=True, slots=True)
class Overview:
    """The console's front page."""

    sagas: list[TypeStatusCount]
    outbox_depth: int
    failed_outbox: int
    overdue_deadlines: int
    dead_letters: int
    parked: int
    # Counts stop at this many (the page reads indexes up to it, never whole tables).
    cap: int = 10_000
    # None when the broker could not be asked (the page shows "unknown").
    lag: ConsumerLag | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionLag:
    """How far the processor's stored position is behind one partition's end.

    Attributes:
        topic: The topic.
        partition: The partition.
        stored: The next offset the processor will read (None: nothing consumed yet).
        high: The broker's high watermark (the offset the next record will get).
        lag: Records not consumed yet.
    """

    topic: str
    partition: int
    stored: int | None
    high: int
    lag: int


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumerLag:
    """The consumer group's lag: the total and each partition's, largest first."""

    total: int
    partitions: list[PartitionLag]


def consumer_lag(
    stored: Mapping[tuple[str, int], int | None],
    marks: Mapping[tuple[str, int], tuple[int, int]],
) -> ConsumerLag:
    """Lag from stored positions and the broker's (low, high) watermarks.

    A partition with no stored position counts from its low watermark (everything retained is
    still to be read); one the broker did not report is left out.
    """
    rows = []
    for tp, position in stored.items():
        if tp not in marks:
            continue
        low, high = marks[tp]
        start = position if position is not None else low
        rows.append(PartitionLag(tp[0], tp[1], position, high, max(0, high - start)))
    rows.sort(key=lambda r: (-r.lag, r.topic, r.partition))
    return ConsumerLag(sum(r.lag for r in rows), rows)


def payload_text(value: bytes | None) -> str | None:
    """A stored value for display: its text when it is UTF-8, else ``base64:`` and its base64."""
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(value).decode()


def jsonable(value: Any) -> Any:
    """``value`` with dataclasses, datetimes, durations, enums and bytes made JSON-ready."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, bytes):
        return payload_text(value)
    return value
