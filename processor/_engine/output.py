"""The rows a planned batch writes.

History (with the audit trail), commands, dead letters, and each saga's row and deadline changes
at the end of the batch: :class:`RowWriter`, which the planner's steps share.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic_core import to_json

from processor._authoring.handles import CommandIntent
from processor._authoring.messages import Message, MessageRegistry
from processor._engine.decode import (
    Event,
    FiredDeadline,
    Operator,
)
from processor._engine.records import OutboxRow, Record
from processor._engine.rows import (
    PARKED,
    DeadLetter,
    HistoryRow,
    Outcome,
    SagaKey,
    SagaWrite,
    WriteSet,
)
from processor._engine.working import Item, Working, storable
from processor._invocation import command_message_id
from processor._wire import (
    HEADER_TRACEPARENT,
    HEADER_TRACESTATE,
    Topics,
    child_traceparent,
    dead_letter_headers,
    envelope,
)

WAITING = "WAITING"
"""A saga a handler handed to a person (``SagaLifecycle.escalate``): the machine states' name."""
WAITING_ON_A_PERSON = "waiting on a person: "
"""How the row's reason column starts for such a saga (``parked`` lists them by it)."""

HistoryPayload = Literal["full", "hashed", "off"]
"""What the history keeps of each record: headers and value; headers and the value's SHA-256;
or neither (the commands and deadlines each step produced are kept in every mode)."""


class RowWriter:
    """Turns the planner's decisions into a ``WriteSet``'s rows.

    Args:
        registry: Message types, for the wire name and version of each command.
        topics: How the topic prefix applies to command topics.
        dead_letter_topic: Where rejected records go (the prefix already applied).
        history_payload: What the history keeps of each record.
    """

    def __init__(
        self,
        registry: MessageRegistry,
        topics: Topics,
        *,
        dead_letter_topic: str,
        history_payload: HistoryPayload,
    ) -> None:
        self._registry = registry
        self._topics = topics
        self._dead_letter_topic = dead_letter_topic
        self._history_payload = history_payload
        self._now_text: tuple[datetime | None, str] = (None, "")
        # A command class's wire name and version text, looked up once per class.
        self._wire_types: dict[type[Message], tuple[str, str]] = {}
        self._due_text: tuple[datetime | None, str] = (None, "")

    def history(
        self,
        ws: WriteSet,
        w: Working,
        item: Item,
        outcome: Outcome,
        *,
        version: int | None = None,
        detail: str | None = None,
        effects: Mapping[str, Any] | None = None,
    ) -> None:
        """Records what ``item`` did to the saga, with the record as the history keeps it."""
        record = item.decoded.record
        decoded = item.decoded
        headers: Mapping[str, str] | None
        if isinstance(decoded, FiredDeadline):
            kind, message_type = "deadline", f"deadline:{decoded.name}"
            headers = None
        elif isinstance(decoded, Operator):
            kind, message_type = "operator", f"operator:{decoded.request.action}"
            headers = None
        else:
            kind, message_type = "event", decoded.metadata.message_type
            # The dict decode built once from the record: shared, not copied.
            headers = decoded.metadata.headers
        payload = digest = None
        mode = self._history_payload
        if mode == "off":
            headers = None
        else:
            if headers is None:
                headers = record.headers_text()
            if mode == "full":
                payload = record.value  # the record's own bytes, stored as they came
            else:
                digest = hashlib.sha256(record.value or b"").digest()
        ws.history.append(
            HistoryRow(
                w.bound.saga_type,
                w.saga_id,
                item.message_id,
                message_type,
                kind,
                outcome,
                version,
                record.topic,
                record.partition,
                record.offset,
                detail,
                headers,
                payload,
                digest,
                effects,
            )
        )
        if outcome is not Outcome.APPLIED:
            ws.counts[outcome] += 1

    def trace(self, item: Item) -> tuple[str | None, str | None]:
        """The item's W3C trace context, as (traceparent, tracestate)."""
        decoded = item.decoded
        if isinstance(decoded, Event):
            # Decode already made a dict of the headers (valid UTF-8, the last repeat winning,
            # as Record.header reads them): no second pass over the record's headers.
            headers = decoded.metadata.headers
            if not headers:
                return None, None
            return headers.get(HEADER_TRACEPARENT), _tracestate(headers.get(HEADER_TRACESTATE))
        return trace_of(decoded.record)

    def correlation(self, item: Item) -> str:
        """The correlation id the item's commands carry: the event's own, else the saga id."""
        if isinstance(item.decoded, Event) and item.decoded.metadata.correlation_id:
            return item.decoded.metadata.correlation_id
        return item.saga_id

    def command(
        self,
        w: Working,
        intent: CommandIntent,
        index: int,
        causation: str,
        correlation: str,
        now: datetime,
        trace: tuple[str | None, str | None] = (None, None),
        source: tuple[str, int] | None = None,
    ) -> OutboxRow:
        """The outbox row of a handler's ``index``-th command; raises if it cannot be encoded."""
        cls = type(intent.message)
        wire = self._wire_types.get(cls)
        if wire is None:
            mtype = self._registry.of(cls)
            wire = self._wire_types[cls] = (mtype.name, str(mtype.version))
        type_name, version = wire
        if intent.headers:
            for name, text in intent.headers.items():
                if "\x00" in name or "\x00" in text:
                    raise ValueError(f"header {name[:64]!r} holds a NUL character")
        # Version and position make the id stable if this input is ever planned again; the
        # version is the one this input's handler produces.
        seq = ((w.version + 1) << 16) | index
        message_id = command_message_id(w.bound.saga_type, w.saga_id, seq)
        traceparent, tracestate = trace
        # The command continues the event's trace, one span further (see wire).
        child = child_traceparent(traceparent, message_id)
        headers = envelope(
            message_id=message_id,
            message_type=type_name,
            schema_version=version,
            correlation_id=correlation,
            causation_id=causation,
            occurred_at=self._occurred_at(now),
            saga_type=w.bound.saga_type,
            saga_id=w.saga_id,
            traceparent=child,
            tracestate=tracestate if child is not None and tracestate else None,
            deadline_unix_ms=intent.deadline_unix_ms,
            # The handler's headers; the engine's own win a clash.
            extra=intent.headers,
        )
        message = intent.message
        # Positional, as for the other rows built per event: keywords cost a slots dataclass's
        # __init__ about three times as much.
        return OutboxRow(
            w.bound.saga_type,
            w.saga_id,
            self._topics.name(intent.topic),
            intent.key.encode(),
            headers,
            # What model_dump_json() returns, as the bytes it encodes them from.
            message.__pydantic_serializer__.to_json(message),
            None,
            source,
        )

    def _occurred_at(self, now: datetime) -> str:
        # One batch shares one clock reading; format it once rather than once per command.
        if self._now_text[0] is not now:
            self._now_text = (now, now.isoformat())
        return self._now_text[1]

    def iso(self, at: datetime) -> str:
        """``at`` in ISO 8601, as the history's effects show a deadline's due time."""
        # A batch's deadlines scheduled `after=` one timeout share one due time: format it once.
        # Equal times in the same zone object (and fold) have equal fields and offsets, so equal
        # text.
        last, text = self._due_text
        if last is None or last != at or last.tzinfo is not at.tzinfo or last.fold != at.fold:
            text = at.isoformat()
            self._due_text = (at, text)
        return text

    def dead_letter(self, ws: WriteSet, record: Record, reason: str, detail: str) -> None:
        """Sends ``record`` to the dead-letter topic with why, and keeps it in the database."""
        record = storable(record)
        ws.dead_letters.append(DeadLetter(record, reason, detail))
        headers = dead_letter_headers(
            record.headers_text(),
            reason=reason,
            detail=detail,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
        )
        ws.outbox.append(
            OutboxRow(
                None,
                None,
                self._dead_letter_topic,
                record.key,
                headers,
                record.value or b"",
                source=(record.topic, record.partition),
            )
        )
        ws.counts["dead-lettered"] += 1

    def flush(self, ws: WriteSet, w: Working, unstorable: dict[SagaKey, str]) -> None:
        """Adds the saga's row, or its key to ``unstorable`` when its state cannot be stored."""
        if not w.dirty:
            return
        row = w.row
        bound = w.bound
        if w.load_error is not None and row is not None:
            # A state that did not load is written back as it was, at its own version.
            state, state_version = row.state, row.state_version
        else:
            try:
                state = bound.state_to_json(w.state) if w.state is not None else None
                # As the store will encode it: a lone surrogate passes the dump, fails only here.
                to_json(state)
            except Exception as e:  # the saga's own values: park it, not the batch
                unstorable[(bound.saga_type, w.saga_id)] = _unstorable(e)
                return
            state_version = bound.state_version
        ws.sagas.append(
            # Positional (see command): type, id, state, status, version, expected version,
            # parked reason, machine state, state version.
            SagaWrite(
                bound.saga_type,
                w.saga_id,
                state,
                w.status or PARKED,
                w.version,
                row.version if row is not None else None,
                w.parked_reason
                if w.status == PARKED
                else f"{WAITING_ON_A_PERSON}{w.waiting}"
                if w.waiting
                else None,
                # Once ended, how it ended; waiting on a person, WAITING; else a state
                # machine's current state.
                w.outcome or (WAITING if w.waiting else bound.machine_state(w.state)),
                state_version,
            )
        )
        key = (w.bound.saga_type, w.saga_id)
        if w.cleared:
            ws.deadline_clears.append(key)
        # A saga with no row before this batch (overlay included) has no deadline rows yet: its
        # schedules are plain inserts, without the delete that replaces a stored one.
        stored = w.row is not None
        for name, insert in w.deadline_ops.items():
            if stored:
                ws.deadline_deletes.append((*key, name))
            if insert is not None:
                ws.deadline_inserts.append(insert)


def _unstorable(error: Exception) -> str:
    """Why a state cannot be stored, without its values (the error's text quotes them)."""
    text = str(error)
    if "utf-8" in text.lower() and ("decode" in text or "invalid" in text):
        problem = "a bytes value is not valid UTF-8"
    elif "surrogate" in text:
        problem = "a string holds a lone surrogate (not valid Unicode)"
    else:
        problem = type(error).__name__
    return f"state cannot be stored as JSON: {problem}"


def trace_of(record: Record) -> tuple[str | None, str | None]:
    """The record's W3C trace context headers, as (traceparent, tracestate)."""
    if not record.headers:
        return None, None
    return record.header(HEADER_TRACEPARENT), _tracestate(record.header(HEADER_TRACESTATE))


def _tracestate(state: str | None) -> str | None:
    if state is not None and ("\x00" in state or len(state) > 512):
        return None  # not a valid tracestate (at most 32 short members), and unstorable
    return state
