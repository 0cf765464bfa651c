"""Running a saga's handlers, and the parking every step may decide on.

A handler run applies what the handler decided (state, commands, deadlines, the end) or parks the
saga with a reason that names the error's type and where it happened, never payload values.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from processor._authoring.handles import CancelDeadline, DeadlineOp, SagaOutcome, ScheduleDeadline
from processor._authoring.messages import HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE
from processor._authoring.upcasting import MissingUpcaster
from processor._engine.output import WAITING_ON_A_PERSON, RowWriter
from processor._engine.records import OutboxRow, Record
from processor._engine.rows import (
    ACTIVE,
    ENDED,
    PARKED,
    DeadlineInsert,
    Outcome,
    ParkedMessage,
    SagaRow,
    WriteSet,
)
from processor._engine.working import Item, Working
from processor._errors import HandlerError, describe_error
from processor._invocation import BoundSaga

HandlerSpan = Callable[[str, str, Record], AbstractContextManager[object]]
"""Wraps each handler call: (saga type, saga id, input record) -> a context to run it in."""


def load(bound: BoundSaga, saga_id: str, row: SagaRow | None, purged: bool = False) -> Working:
    """The saga as the batch starts on it; a state that does not load is kept as its error."""
    if row is None:
        # A tombstone: the saga ended and retention purged its row. It stays ended.
        return Working(bound, saga_id, None, None, ENDED if purged else None, 0)
    try:
        state = (
            bound.state_from_json(row.state, row.state_version) if row.state is not None else None
        )
    except MissingUpcaster as e:
        w = Working(bound, saga_id, row, None, row.status, row.version, row.parked_reason)
        w.load_error = str(e)[:1000]
        return w
    except Exception as e:  # any error of the saga's own model (validators run user code)
        w = Working(bound, saga_id, row, None, row.status, row.version, row.parked_reason)
        cls = bound.definition.state_cls.__qualname__
        at = ""
        if row.state_version != bound.state_version:
            at = f" v{bound.state_version} (upcast from v{row.state_version})"
        w.load_error = f"stored state does not load into {cls}{at}: {describe_error(e)}"[:1000]
        return w
    w = Working(bound, saga_id, row, state, row.status, row.version, row.parked_reason)
    reason = row.parked_reason
    if row.status == ACTIVE and reason is not None and reason.startswith(WAITING_ON_A_PERSON):
        # Still with a person: a write that runs no handler (an operator's deadline action)
        # keeps it so; the next handler that runs decides again.
        w.waiting = reason[len(WAITING_ON_A_PERSON) :]
    return w


class Handlers:
    """Runs handlers with their retries and records what they decide, or parks the saga.

    Args:
        writer: Builds the rows: history, commands.
        attempts: Runs of a handler that raises ``HandlerError`` before the saga is parked.
        deadline_ids: Makes the id of each scheduled deadline's row.
    """

    def __init__(
        self, writer: RowWriter, *, attempts: int, deadline_ids: Callable[[], str]
    ) -> None:
        self._attempts = attempts
        self._deadline_ids = deadline_ids
        # The writer's methods, bound once: each runs at least once per event.
        self._history = writer.history
        self._command = writer.command
        self._correlation = writer.correlation
        self._trace = writer.trace
        self._iso = writer.iso
        # Wraps each handler call (an OpenTelemetry span, see processor/_observe/tracing.py).
        self.span: HandlerSpan | None = None

    def fail(
        self,
        ws: WriteSet,
        w: Working,
        item: Item,
        reason: str,
        error: BaseException | None = None,
    ) -> None:
        """Parks the saga on ``item`` for a reason of its own (not held behind another).

        ``error``, the code error behind it if any, is logged with its traceback.
        """
        w.parked_reason = reason
        self.park(ws, w, item, reason, Outcome.PARKED, error)
        ws.counts["handler-failed"] += 1

    def park(
        self,
        ws: WriteSet,
        w: Working,
        item: Item,
        reason: str,
        outcome: Outcome,
        error: BaseException | None = None,
    ) -> None:
        """Holds ``item`` behind the saga, which is (or now is) parked."""
        w.status = PARKED
        w.version += 1
        w.dirty = True
        ws.parked.append(
            ParkedMessage(w.bound.saga_type, w.saga_id, item.decoded.record, reason, error)
        )
        self._history(ws, w, item, outcome, version=w.version, detail=reason)

    def run(self, ws: WriteSet, w: Working, item: Item, call: Any, now: datetime) -> bool:
        """Runs a handler with its retries; parks the saga and returns False if it fails."""
        error: HandlerError | None = None
        span = self.span
        for _ in range(self._attempts):
            try:
                if span is None:
                    outcome = call()
                else:
                    with span(w.bound.saga_type, w.saga_id, item.decoded.record):
                        outcome = call()
                break
            except HandlerError as e:
                error = e
            except Exception as e:  # not the handler's: no retry would change it
                self.fail(ws, w, item, describe_error(e)[:1000], e)
                return False
        else:
            assert error is not None
            cause = error.cause if getattr(error, "cause", None) is not None else error
            reason = f"{error.handler_name}: {describe_error(cause)}"[:1000]
            self.fail(ws, w, item, reason, error)
            return False
        correlation = self._correlation(item)
        record = item.decoded.record
        trace = self._trace(item)
        # The relay of this input partition's owner publishes what it caused (fenced by epoch).
        source = (record.topic, record.partition)
        rows: list[OutboxRow] = []
        for i, intent in enumerate(outcome.commands):
            try:
                rows.append(
                    self._command(w, intent, i, item.message_id, correlation, now, trace, source)
                )
            except Exception as e:  # e.g. a class nobody registered: nothing is applied
                what = type(intent.message).__qualname__
                reason = f"{outcome.handler_name}: command {i} ({what}): {describe_error(e)}"
                self.fail(ws, w, item, reason[:1000], e)
                return False
        w.state = outcome.state
        w.version += 1
        w.dirty = True
        w.status = ENDED if outcome.ended else ACTIVE
        if outcome.escalated is not None and w.waiting is None:
            # A new wait on a person (a reminder of one already waiting is not counted).
            ws.escalations[(w.bound.saga_type, outcome.escalation or "handler")] += 1
        w.waiting = outcome.escalated
        if outcome.ended:
            w.outcome = outcome.outcome or SagaOutcome.COMPLETED
            ws.outcomes[(w.bound.saga_type, str(w.outcome))] += 1
        ws.outbox.extend(rows)
        effects: dict[str, Any] = {}
        if rows:
            effects["commands"] = [
                {
                    "message_id": r.headers[HEADER_MESSAGE_ID],
                    "type": r.headers[HEADER_MESSAGE_TYPE],
                    "topic": r.topic,
                }
                for r in rows
            ]
        if outcome.ended:
            w.cleared = True
            w.deadline_ops.clear()
            effects["ended"] = True
        elif outcome.deadlines:
            effects["deadlines"] = [self._deadline(w, op, item, trace) for op in outcome.deadlines]
        self._history(
            ws,
            w,
            item,
            Outcome.APPLIED,
            version=w.version,
            detail=outcome.handler_name,
            effects=effects or None,
        )
        ws.counts["ended" if outcome.ended else "applied"] += 1
        return True

    def _deadline(
        self, w: Working, op: DeadlineOp, item: Item, trace: tuple[str | None, str | None]
    ) -> dict[str, Any]:
        """Records the deadline operation; returns its entry for the history's effects."""
        if isinstance(op, CancelDeadline):
            w.deadline_ops[op.name] = None
            return {"op": "cancel", "name": op.name}
        assert isinstance(op, ScheduleDeadline)
        record = item.decoded.record
        traceparent, tracestate = trace
        # Positional, as the other rows built per event (see RowWriter.command).
        insert = w.deadline_ops[op.name] = DeadlineInsert(
            self._deadline_ids(),
            w.bound.saga_type,
            w.saga_id,
            op.name,
            op.due_at,
            op.payload,
            # Fired records go back to the partition this saga's input arrives on.
            record.topic,
            record.partition,
            traceparent,
            tracestate,
        )
        return {
            "op": "schedule",
            "name": op.name,
            "id": insert.id,
            "due_at": self._iso(op.due_at),
        }
