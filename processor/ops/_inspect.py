"""`show`, operator requests and dead-letter replay: the services behind the CLI and console.

Operator requests that change a saga (cancel it, fire or cancel a deadline) are not written
to its row: they are signed records sent into the saga's own input partition, so the consumer
applies them in log order with the saga's events, fenced and deduplicated like any record, and
the saga's history shows who asked and why.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TypedDict, Unpack

from processor._authoring.choices import known_keywords
from processor._engine.decode import Reason
from processor._engine.records import OutboxRow
from processor._engine.rows import AuditEntry
from processor._errors import Refused, SagaError
from processor._ports import InspectStore, RecordProducer
from processor._ports.views import DeadLetterRow, SagaView, TimelineEntry
from processor._wire import (
    HEADER_DEAD_LETTER_DETAIL,
    HEADER_DEAD_LETTER_REASON,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC,
    OperatorAction,
    OperatorRecord,
)
from processor.ops._journal import function_journal
from processor.ops._progress import step_progress

__all__ = [
    "NoSuchSaga",
    "NotSent",
    "OperatorAsk",
    "OperatorRefused",
    "RequestDeadLettered",
    "operator_request",
    "purge_dead_letters",
    "replay_dead_letter",
    "send_operator_request",
    "show_saga",
    "wait_for_outcome",
]

_DEAD_LETTER_HEADERS = frozenset(
    {
        HEADER_DEAD_LETTER_REASON,
        HEADER_DEAD_LETTER_DETAIL,
        HEADER_SOURCE_TOPIC,
        HEADER_SOURCE_PARTITION,
        HEADER_SOURCE_OFFSET,
    }
)


class NoSuchSaga(Refused):
    """No saga instance (or dead letter) has that key."""


class OperatorRefused(SagaError):
    """An operator request could not be sent (no key, no partition known, delivery failed)."""


class NotSent(OperatorRefused):
    """The broker did not acknowledge the record in time: nothing was done."""


class RequestDeadLettered(Refused):
    """A processor set an operator request aside as a dead letter instead of deciding it."""


# How long before the wait began a request's dead letter is looked for: it was sent just before
# (within the send's timeout). It bounds the read of the dead letters by their age index.
_DEAD_LETTER_LOOKBACK = timedelta(minutes=5)


# A saga's operator actions `show` lists, at most.
SHOWN_AUDIT = 1000


def show_saga(store: InspectStore, saga_type: str, saga_id: str, limit: int = 1000) -> SagaView:
    """Everything known about one saga: row, state, pending work, timeline, operator actions.

    Pending work is its deadlines and its held and failed rows; the operator actions are the
    latest 1,000 recorded for it, oldest first. An orchestrated saga's step in flight and a
    saga function's journal are read from its state.

    Raises:
        NoSuchSaga: There is no such saga instance.
    """
    try:
        summary, state = store.saga(saga_type, saga_id)
    except LookupError as e:
        raise NoSuchSaga(str(e)) from e
    deadlines = store.deadlines(saga_type, saga_id)
    return SagaView(
        saga=summary,
        state=state,
        deadlines=deadlines,
        parked_messages=store.held(saga_type, saga_id),
        failed_outbox=store.failed(saga_type, saga_id),
        timeline=store.timeline(saga_type, saga_id, limit=limit),
        audit=store.audit(saga_type=saga_type, saga_id=saga_id, limit=SHOWN_AUDIT)[::-1],
        step=step_progress(state, deadlines),
        journal=function_journal(state),
    )


class _Asked(TypedDict):
    # Required as a class of its own: Python reads ``Required[...]`` in no postponed annotation.
    action: OperatorAction
    saga_type: str
    saga_id: str
    by: str
    reason: str


class OperatorAsk(_Asked, total=False):
    """What an operator asks of one saga; the first five are required.

    Attributes:
        action: What is asked.
        saga_type: The saga's type.
        saga_id: The saga's id.
        by: Who asks.
        reason: Why; a request without one is refused.
        name: The deadline, decision or injected event type the action names, if it names one.
        route: Moves the request to the partition the saga's events go to now, when its input
            topic grew since its latest event (see :func:`processor._engine.growth.route`).
        clock: When the request is issued, in seconds since the epoch; ``time.time`` by
            default. The processor refuses a request older than ``SAGA_OPERATOR__EXPIRY``, so
            a copy taken off the topic cannot be sent again later.
        message: An injected event's JSON value (``OperatorAction.INJECT``; ``name`` its type).
    """

    name: str | None
    route: Callable[[str, bytes, int], int] | None
    clock: Callable[[], float]
    message: str | None


def send_operator_request(
    store: InspectStore,
    producer: RecordProducer,
    key: bytes | None,
    *,
    timeout: float = 30.0,
    **ask: Unpack[OperatorAsk],
) -> OperatorRecord:
    """Signs the request and sends it into the saga's input partition; returns it once acked.

    The partition is the one the saga's latest event came from (fired deadlines go there too),
    so the request is ordered with whatever the saga receives next. ``ask`` is the request
    (:class:`OperatorAsk`); ``timeout`` how long the broker has to acknowledge it, in seconds.

    Raises:
        OperatorRefused: No operator key is configured, no reason was given, the saga has no
            event on record, or the broker did not acknowledge the record.
        NoSuchSaga: There is no such saga instance.
    """
    request, row = operator_request(store, key, **ask)
    failures = producer.send([row], timeout)
    if failures:
        raise NotSent(f"the broker did not take the request: {failures[0]}")
    return request


def operator_request(
    store: InspectStore, key: bytes | None, *, batch: str | None = None, **ask: Unpack[OperatorAsk]
) -> tuple[OperatorRecord, OutboxRow]:
    """The signed request and the row that carries it to the saga's input partition, unsent.

    What :func:`send_operator_request` sends; a batch (:mod:`processor.ops._batch`) sends many
    such rows at once, each carrying ``batch``.

    Raises:
        OperatorRefused: No operator key is configured, no reason was given, or the saga has
            no event on record.
        NoSuchSaga: There is no such saga instance.
    """
    known_keywords(ask, OperatorAsk)
    saga_type, saga_id, reason = ask["saga_type"], ask["saga_id"], ask["reason"]
    if key is None:
        raise OperatorRefused("no operator key: set SAGA_OPERATOR__KEY to the processor's key")
    if not reason.strip():
        raise OperatorRefused("a reason is required")
    try:
        store.saga(saga_type, saga_id)
    except LookupError as e:
        raise NoSuchSaga(str(e)) from e
    where = store.input_partition(saga_type, saga_id)
    if where is None:
        raise OperatorRefused(f"saga {saga_type} {saga_id} has no event on record to follow")
    issued_at = int(ask.get("clock", time.time)() * 1000)
    request = OperatorRecord(
        ask["action"],
        saga_type,
        saga_id,
        uuid.uuid4().hex,
        ask["by"],
        reason,
        ask.get("name"),
        issued_at=issued_at,
        message=ask.get("message"),
        batch=batch,
    )
    route = ask.get("route")
    row = OutboxRow(
        saga_type=saga_type,
        saga_id=saga_id,
        topic=where[0],
        key=saga_id.encode(),
        headers=request.headers(key),
        value=request.value(),
        partition=where[1] if route is None else route(where[0], saga_id.encode(), where[1]),
    )
    return request, row


def wait_for_outcome(
    store: InspectStore,
    saga_type: str,
    saga_id: str,
    message_id: str,
    timeout: float,
    poll: float = 0.2,
) -> TimelineEntry | None:
    """The timeline entry a processor wrote for ``message_id``, once it is there.

    Args:
        store: Read queries.
        saga_type: The saga's type.
        saga_id: The saga's id.
        message_id: The request's message id (``operator:<command id>``).
        timeout: Seconds to wait at most.
        poll: Seconds between two reads of the new timeline rows.

    Returns:
        The entry (``applied``, ``operator-refused``, ``duplicate``, ...), or None on timeout.

    Raises:
        RequestDeadLettered: A processor dead-lettered the request rather than decide it: its
            signature was not accepted (``unauthenticated``), or it was not where its saga's
            records are (``misplaced``). No history row will come.
    """
    started = time.monotonic()
    after = 0
    while True:
        for entry in store.timeline(saga_type, saga_id, after=after):
            after = entry.id
            # A request held behind a parked saga is applied later, by a retry's replay.
            if entry.message_id == message_id and entry.outcome != "parked-behind":
                return entry
        waited = time.monotonic() - started
        letter = store.dead_letter_of(message_id, _DEAD_LETTER_LOOKBACK + timedelta(seconds=waited))
        if letter is not None:
            raise RequestDeadLettered(dead_lettered(message_id, letter))
        if waited >= timeout:
            return None
        time.sleep(poll)


def dead_lettered(message_id: str, letter: DeadLetterRow) -> str:
    """Why an operator request was refused, from the dead letter a processor made of it."""
    where = f"dead-lettered as {letter.reason}, dead letter {letter.id}"
    if letter.reason == Reason.UNAUTHENTICATED:
        return (
            f"{message_id} refused: the processor did not accept its signature ({where}): sign "
            "with the processor's key, SAGA_OPERATOR__KEY, or your own from its "
            "SAGA_OPERATOR__KEYS"
        )
    return f"{message_id} refused: {where}: {letter.detail or 'no detail'}"


def replay_dead_letter(
    store: InspectStore,
    producer: RecordProducer,
    row_id: int,
    timeout: float = 30.0,
    *,
    actor: str,
    reason: str | None,
) -> DeadLetterRow:
    """Sends a dead letter back to its source topic and partition, then deletes it.

    The record goes back with its key, value and original headers (the dead-letter headers
    dropped); a record that is still bad is dead-lettered again, with a new row. The delete
    records the replay in the audit trail (who, why, which row, where it went); should
    another operator's purge have taken the row meanwhile, the replay is recorded alone.

    Raises:
        NoSuchSaga: There is no such dead letter.
        NotSent: The broker did not acknowledge the record (the row is kept).
    """
    try:
        row, key, value = store.dead_letter(row_id)
    except LookupError as e:
        raise NoSuchSaga(str(e)) from e
    headers = {k: v for k, v in (row.headers or {}).items() if k not in _DEAD_LETTER_HEADERS}
    out = OutboxRow(None, None, row.topic, key, headers, value or b"", partition=row.partition)
    failures = producer.send([out], timeout)
    if failures:
        raise NotSent(f"the broker did not take dead letter {row_id}: {failures[0]}")
    where = {"topic": row.topic, "partition": row.partition, "offset": row.offset}
    entry = AuditEntry(
        actor,
        "dead-letter-replay",
        reason,
        target={**where, "message_id": row.message_id, "message_type": row.message_type},
        outcome="replayed",
    )
    if store.purge_dead_letters([row_id], audit=entry) == 0:
        store.record_audit(entry.touching([]))
    return row


def purge_dead_letters(
    store: InspectStore,
    *,
    actor: str,
    reason: str | None,
    ids: Sequence[int] | None = None,
    older_than: timedelta | None = None,
) -> int:
    """Deletes the selected dead letters for good and records who did it and why.

    The audit entry is written with the delete (when anything went), with the count and the
    ids; returns how many went.

    Raises:
        OperatorRefused: Neither ids nor an age selects anything.
    """
    if not ids and older_than is None:
        raise OperatorRefused("name the dead letters: --id or --older-than")
    selection: dict[str, object] = {}
    if older_than is not None:
        selection["older_than_seconds"] = older_than.total_seconds()
    entry = AuditEntry(actor, "dead-letter-purge", reason, target=selection, outcome="purged")
    return store.purge_dead_letters(ids or None, older_than, audit=entry)
