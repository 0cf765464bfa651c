"""The planner's steps for one item.

An event, a fired deadline, a record newer than the code; and the handler run, deadline and
parking decisions they share.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from processor.engine.decode import (
    Event,
    FiredDeadline,
    TooNew,
)
from processor.engine.output import WAITING_ON_A_PERSON, Output
from processor.engine.records import OutboxRow
from processor.engine.rows import (
    ACTIVE,
    ENDED,
    PARKED,
    DeadlineInsert,
    Loaded,
    Outcome,
    ParkedMessage,
    SagaRow,
    WriteSet,
)
from processor.engine.working import Item, Working
from processor.errors import HandlerError, describe_error
from processor.handles import CancelDeadline, DeadlineOp, SagaOutcome, ScheduleDeadline
from processor.messages import (
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
)
from processor.runner import BoundSaga, DeadlineInput, EventInput
from processor.upcasting import MissingUpcaster

# In the parked reason of a saga held by an event newer than the code; a processor that starts
# with newer code retries those sagas (processor.ops.parked.resume_too_new).
TOO_NEW = "is newer than this code knows"


class Steps(Output):
    """What the planner does with one routed item (a base of ``Planner``)."""

    def _load(
        self, bound: BoundSaga, saga_id: str, row: SagaRow | None, purged: bool = False
    ) -> Working:
        if row is None:
            # A tombstone: the saga ended and retention purged its row. It stays ended.
            return Working(bound, saga_id, None, None, ENDED if purged else None, 0)
        try:
            state = (
                bound.state_from_json(row.state, row.state_version)
                if row.state is not None
                else None
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

    def _fail(
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
        self._park(ws, w, item, reason, Outcome.PARKED, error)
        ws.counts["handler-failed"] += 1

    def _event(
        self,
        ws: WriteSet,
        w: Working,
        item: Item,
        event: Event,
        now: datetime,
        seen: set[tuple[str, str, str]],
        mkey: tuple[str, str, str],
    ) -> None:
        handler = w.bound.definition.event_handlers[type(event.message)]
        if w.status == PARKED:
            self._park(ws, w, item, "behind a parked saga", Outcome.PARKED_BEHIND)
        elif w.status == ENDED:
            detail = "ended; purged by retention" if w.row is None else None
            self._history(ws, w, item, Outcome.IGNORED_ENDED, detail=detail)
        elif w.status is None and not handler.start:
            self._history(ws, w, item, Outcome.NO_SAGA)
        elif w.load_error is not None:
            self._fail(ws, w, item, w.load_error)
        else:
            inp = EventInput(event.message, event.metadata)
            self._run(ws, w, item, lambda: w.bound.handle_event(w.state, w.saga_id, inp, now), now)
            if w.status != PARKED:
                seen.add(mkey)

    def _too_new(self, ws: WriteSet, w: Working, item: Item, d: TooNew) -> None:
        if w.status == PARKED:
            self._park(ws, w, item, "behind a parked saga", Outcome.PARKED_BEHIND)
        elif w.status == ENDED:
            # Whatever the new version says, an ended saga ignores it.
            self._history(ws, w, item, Outcome.IGNORED_ENDED)
        else:
            # Also when no saga exists yet: only the new code knows whether this starts one.
            reason = (
                f"{d.metadata.message_type!r} schema-version {d.version} {TOO_NEW} "
                f"(v{d.known}); it goes on by itself once code that knows it starts"
            )
            w.parked_reason = reason
            self._park(ws, w, item, reason, Outcome.PARKED)
            ws.counts["too-new"] += 1

    def _fire(
        self,
        ws: WriteSet,
        w: Working,
        item: Item,
        fired: FiredDeadline,
        loaded: Loaded,
        now: datetime,
        replay: bool,
    ) -> None:
        ref = loaded.deadlines.get(fired.deadline_id)
        if ref is not None and (ref.saga_type, ref.saga_id, ref.name) != (
            fired.saga_type,
            fired.saga_id,
            fired.name,
        ):
            # The id names another saga's (or another name's) deadline: forged or corrupt.
            detail = "the deadline row belongs to another saga or name"
            self._history(ws, w, item, Outcome.DEADLINE_REJECTED, detail=detail)
            return
        if w.status == PARKED:
            self._park(ws, w, item, "behind a parked saga", Outcome.PARKED_BEHIND)
            return
        if replay:
            current = ref is not None and ref.due_at <= now
        else:
            current = (
                ref is not None
                and ref.dispatch_token == fired.token
                # fired by a poller that has since lost the lease
                and loaded.lease_token == fired.token
            )
        stale = (
            not current
            or w.status != ACTIVE
            or w.cleared
            or fired.name in w.deadline_ops  # cancelled or rescheduled earlier in this batch
        )
        if stale or ref is None:
            if (
                ref is not None
                and not replay
                and ref.dispatch_token == fired.token
                and loaded.lease_token != fired.token
                and w.status == ACTIVE
                and not w.cleared
                and fired.name not in w.deadline_ops
            ):
                # Consumed without effect while the row still waits under this dead token: make
                # it due again, so the current leader fires it (no timer that lag can outrun).
                ws.deadline_resets.append((fired.deadline_id, fired.token))
            self._history(ws, w, item, Outcome.DEADLINE_STALE)
            return
        if fired.name not in w.bound.definition.deadline_handlers:
            # Kept, like a failed handler's deadline: a deploy that brings the handler back,
            # then a retry, runs it.
            self._fail(ws, w, item, f"no deadline handler for {fired.name!r}")
            return
        if w.load_error is not None:
            self._fail(ws, w, item, w.load_error)
            return
        inp = DeadlineInput(fired.name, fired.deadline_id, ref.payload, ref.due_at)
        call = lambda: w.bound.handle_deadline(w.state, w.saga_id, inp, now)  # noqa: E731
        if self._run(ws, w, item, call, now) and not w.cleared:
            # Consumed by its own handler's transaction, unless the handler set it anew. A
            # handler that failed keeps it, so the parked saga's retry runs it once fixed.
            w.deadline_ops.setdefault(fired.name, None)

    def _run(self, ws: WriteSet, w: Working, item: Item, call: Any, now: datetime) -> bool:
        """Runs a handler with its retries; parks the saga and returns False if it fails."""
        error: HandlerError | None = None
        span = self.handler_span
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
                self._fail(ws, w, item, describe_error(e)[:1000], e)
                return False
        else:
            assert error is not None
            cause = error.cause if getattr(error, "cause", None) is not None else error
            reason = f"{error.handler_name}: {describe_error(cause)}"[:1000]
            self._fail(ws, w, item, reason, error)
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
                self._fail(ws, w, item, reason[:1000], e)
                return False
        w.state = outcome.state
        w.version += 1
        w.dirty = True
        w.status = ENDED if outcome.ended else ACTIVE
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
        # Positional, as the other rows built per event (see Output._command).
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

    def _park(
        self,
        ws: WriteSet,
        w: Working,
        item: Item,
        reason: str,
        outcome: Outcome,
        error: BaseException | None = None,
    ) -> None:
        w.status = PARKED
        w.version += 1
        w.dirty = True
        ws.parked.append(
            ParkedMessage(w.bound.saga_type, w.saga_id, item.decoded.record, reason, error)
        )
        self._history(ws, w, item, outcome, version=w.version, detail=reason)
