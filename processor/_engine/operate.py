"""Operator records in the planner, applied in the saga's log order (``route`` checks them).

An operator's retry (or skip) of a parked saga replays the records held behind it within the
batch that consumes the request: the held records come with the loaded rows, and the replay runs
through the same steps as the consumer's, so it is ordered with the saga's other input, fenced
by the batch's offsets, deduplicated by the request's message id and recorded in the timeline.
It applies all or nothing: if a held record fails again, the saga stays parked as it was and the
request is recorded as refused, with the record and the reason.

A signed record is worth something to whoever copies it off the topic, so each one is decided
once: its message id, whatever the outcome (``rows.DECIDED``), makes a copy a duplicate; and a
record older than the expiry (or issued ahead of the clock by more than the skew) is refused,
judged by the batch's database clock, never by the record's timestamp, which its sender sets.
A record held behind a parked saga was judged fresh when it arrived: its replay does not expire.
"""

from __future__ import annotations

import dataclasses
import sys
from datetime import datetime, timedelta
from typing import Any

from processor._authoring.messages import HEADER_MESSAGE_ID, MessageRegistry
from processor._engine.decode import Event, FiredDeadline, Operator, Rejected, TooNew, decode
from processor._engine.handlers import Handlers
from processor._engine.inject import as_event, name_operator
from processor._engine.output import RowWriter
from processor._engine.records import Record
from processor._engine.reset import Resets
from processor._engine.route import REPLAYS, Router
from processor._engine.rows import (
    ACTIVE,
    DECIDED,
    ENDED,
    PARKED,
    AuditEntry,
    HistoryRow,
    Loaded,
    Outcome,
    WriteSet,
)
from processor._engine.steps import DeadlineSteps, EventSteps
from processor._engine.working import Item, MessageKey, Pass, Working
from processor._wire import OPERATOR_CLOCK_SKEW, OperatorAction, OperatorRecord, present


class OperatorSteps:
    """Plans each routed item against its saga: operator records here, others by their steps.

    A retry's replay runs the held records through :meth:`step` again, routed by ``router``.

    Args:
        writer: Builds the rows: history, dead letters.
        handlers: Runs handlers (an operator's cancel, terminate or resolve) and parks.
        events: The steps of events and records newer than the code.
        deadlines: The step of fired deadlines.
        router: Routes the held records a retry replays.
        registry: Message types, to decode the held records.
        expiry: How long after its issued-at an operator record is still applied
            (``SAGA_OPERATOR__EXPIRY``).
    """

    def __init__(
        self,
        writer: RowWriter,
        handlers: Handlers,
        events: EventSteps,
        deadlines: DeadlineSteps,
        router: Router,
        registry: MessageRegistry,
        *,
        expiry: timedelta,
    ) -> None:
        self._history = writer.history
        self._dead_letter = writer.dead_letter
        self._run = handlers.run
        self._fail = handlers.fail
        self._park = handlers.park
        # Bound once: one of these runs for every item.
        self._event = events.event
        self._too_new = events.too_new
        self._fire = deadlines.fire
        self._route = router.route
        self._registry = registry
        self._expiry = expiry
        self._reset = Resets(writer, router, registry, deadlines).reset

    def step(self, p: Pass, w: Working, item: Item) -> None:
        """Plans one routed item against its saga (the consumer's batch and a retry's replay)."""
        decoded = item.decoded
        if isinstance(decoded, FiredDeadline):
            self._fire(p, w, item, decoded)
            return
        mkey = (w.bound.saga_type, w.saga_id, item.message_id)
        if mkey in p.seen:
            self._history(p.ws, w, item, Outcome.DUPLICATE)
        elif isinstance(decoded, Operator):
            ws = p.ws
            written = (len(ws.history), len(ws.audit))
            self._operate(p, w, item, decoded, mkey)
            row = _row_of(ws, w, item, written[0])
            if row is not None and row.outcome in DECIDED:
                # Whatever the outcome: a later copy (in this batch or sent again) is a duplicate.
                p.seen.add(mkey)
            if row is not None and row.outcome is not Outcome.PARKED_BEHIND:
                _audit(ws, w, item, decoded, row, *written)
        elif isinstance(decoded, TooNew):
            self._too_new(p, w, item, decoded)
        else:
            self._event(p, w, item, decoded, mkey)

    def _operate(self, p: Pass, w: Working, item: Item, op: Operator, mkey: MessageKey) -> None:
        """Applies an operator's request in the saga's log order, like one of its events."""
        ws, now, seen = p.ws, p.now, p.seen
        req = op.request
        label = f"operator {req.action} by {req.by}: {req.reason}"[:1000]
        # First of all, even before a parked saga holds it: a held record is replayed later
        # (p.replay) as it was judged on arrival.
        stale = None if p.replay else _stale(req, now, self._expiry)
        if stale is not None:
            detail = f"{label} ({stale})"[:1000]
            self._history(ws, w, item, Outcome.OPERATOR_REFUSED, detail=detail)
            return
        if req.action in REPLAYS:
            if w.status != PARKED:
                detail = f"{label} (the saga is not parked)"
                self._history(ws, w, item, Outcome.OPERATOR_REFUSED, detail=detail)
                return
            self._replay_held(p, w, item, label)
            return
        if req.action == OperatorAction.INJECT:
            label = f"operator inject {req.name} by {req.by}: {req.reason}"[:1000]
            event = as_event(self._registry, w, item, op)
            if isinstance(event, str):
                detail = f"{label} ({event})"[:1000]
                self._history(ws, w, item, Outcome.OPERATOR_REFUSED, detail=detail)
                return
            # Exactly the event's step; its history row names the operator (see `as_event`).
            written = len(ws.history)
            assert isinstance(event.decoded, Event)
            self._event(p, w, event, event.decoded, mkey)
            name_operator(ws.history[written:], item, label)
            return
        if req.action == OperatorAction.RESET:
            label = f"operator reset before {req.name} by {req.by}: {req.reason}"[:1000]
            self._reset(p, w, item, label, self.step)
            return
        if w.status == PARKED:
            # Held in order with the rest; a retry of the saga replays it.
            self._park(ws, w, item, "behind a parked saga", Outcome.PARKED_BEHIND)
            return
        if w.status == ENDED:
            self._history(ws, w, item, Outcome.IGNORED_ENDED, detail=label)
            return
        if w.status is None:
            self._history(ws, w, item, Outcome.NO_SAGA, detail=label)
            return
        if w.load_error is not None:
            self._fail(ws, w, item, w.load_error)
            return
        if req.action == OperatorAction.CANCEL:
            state = w.state
            why = w.bound.cancel_refusal(state)
            if why is not None:
                detail = f"{label} ({why})"[:1000]
                self._history(ws, w, item, Outcome.OPERATOR_REFUSED, detail=detail)
                return
            call = lambda: w.bound.handle_cancel(  # noqa: E731
                state, w.saga_id, label, req.reason, now, req.by
            )
            if self._run(ws, w, item, call, now):
                seen.add(mkey)
            return
        if req.action == OperatorAction.TERMINATE:
            state = w.state
            label = f"operator terminate by {req.by} (no compensation ran): {req.reason}"[:1000]
            if self._run(ws, w, item, lambda: w.bound.handle_terminate(state, label), now):
                seen.add(mkey)
            return
        if req.action == OperatorAction.RESOLVE:
            state = w.state
            decision = req.name or ""
            why = w.bound.resolve_refusal(state, decision)
            if why is not None:
                detail = f"{label} ({why})"[:1000]
                self._history(ws, w, item, Outcome.OPERATOR_REFUSED, detail=detail)
                return
            label = f"operator resolve {decision} by {req.by}: {req.reason}"[:1000]
            call = lambda: w.bound.handle_resolve(  # noqa: E731
                state, w.saga_id, label, decision, req.reason, now, req.by
            )
            if self._run(ws, w, item, call, now):
                seen.add(mkey)
            return
        if req.name is None:
            self._history(ws, w, item, Outcome.OPERATOR_REFUSED, detail=f"{label} (no name)")
            return
        effects: dict[str, Any]
        if req.action == OperatorAction.DEADLINE_CANCEL:
            w.deadline_ops[req.name] = None
            effects = {"deadlines": [{"op": "cancel", "name": req.name}]}
        else:
            ws.deadline_fire_now.append((w.bound.saga_type, w.saga_id, req.name))
            ws.wake_deadlines = True
            effects = {"deadlines": [{"op": "fire-now", "name": req.name}]}
        w.version += 1
        w.dirty = True
        seen.add(mkey)
        self._history(
            ws, w, item, Outcome.APPLIED, version=w.version, detail=label, effects=effects
        )

    def _replay_held(self, p: Pass, w: Working, item: Item, label: str) -> None:
        """Replays the records held behind parked ``w`` in arrival order, all or nothing."""
        ws, loaded, seen = p.ws, p.loaded, p.seen
        assert isinstance(item.decoded, Operator)
        key = (w.bound.saga_type, w.saga_id)
        stored = list(loaded.held.get(key, ()))
        # Records this very batch held behind the saga are not stored yet: they follow.
        in_batch = [p for p in ws.parked if (p.saga_type, p.saga_id) == key]
        records = [h.record for h in stored] + [p.record for p in in_batch]
        skip = 1 if item.decoded.request.action == OperatorAction.PARKED_SKIP else 0
        # Planned on copies: a failure leaves the batch and the saga as they were.
        trial = WriteSet()
        trial_seen = set(seen)
        trial_pass = Pass(trial, loaded, p.now, trial_seen, True)
        replayed = dataclasses.replace(
            w,
            # As if never parked; as not yet started when its start handler was the one failing.
            status=ACTIVE if w.state is not None else None,
            parked_reason=None,
            version=w.version + 1,
            dirty=True,
            deadline_ops=dict(w.deadline_ops),
        )
        self._history(
            trial, replayed, item, Outcome.APPLIED, version=replayed.version, detail=label
        )
        for n, record in enumerate(records):
            routed, _ = self._route([decode(record, self._registry, sys.maxsize)])
            # An event may also feed sagas of other types: those saw it when it was consumed.
            mine = [
                x
                for x in routed
                if isinstance(x, Rejected) or (x.bound.saga_type, x.saga_id) == key
            ]
            if not mine:
                self._refuse(ws, w, item, label, record, "it no longer routes to this saga")
                return
            for x in mine:
                if isinstance(x, Rejected):
                    self._dead_letter(trial, x.record, x.reason, x.detail)
                elif n < skip:
                    self._history(trial, replayed, x, Outcome.SKIPPED, detail=label)
                    if isinstance(x.decoded, FiredDeadline):
                        _drop_skipped_deadline(replayed, x.decoded, loaded)
                    elif isinstance(x.decoded, Operator):
                        # Dropped on purpose: decided, as a copy sent again would find it.
                        trial_seen.add((*key, x.message_id))
                else:
                    self.step(trial_pass, replayed, x)
                    if trial.parked:
                        self._refuse(ws, w, item, label, record, trial.parked[0].reason)
                        return
        if replayed.status is None:
            # Nothing started the saga (its start was skipped or a duplicate); a row without
            # state would make later events look like they belong to a started saga.
            self._refuse(ws, w, item, label, None, "nothing left would start the saga")
            return
        ws.extend(trial)
        ws.parked = [p for p in ws.parked if not any(p is q for q in in_batch)]
        ws.held_releases.extend(h.parked_id for h in stored)
        # The poller skipped this saga's deadlines while it was parked: the ones that came due
        # meanwhile fire now rather than at its next polling interval.
        ws.wake_deadlines = True
        seen.update(trial_seen)
        seen.add((*key, item.message_id))
        for f in dataclasses.fields(Working):
            setattr(w, f.name, getattr(replayed, f.name))

    def _refuse(
        self,
        ws: WriteSet,
        w: Working,
        item: Item,
        label: str,
        record: Record | None,
        reason: str,
    ) -> None:
        where = f" at {_where(record)}" if record is not None else ""
        detail = f"{label}; replay failed{where}: {reason}; the saga stays parked"[:2000]
        self._history(ws, w, item, Outcome.OPERATOR_REFUSED, detail=detail)


def _stale(req: OperatorRecord, now: datetime, expiry: timedelta) -> str | None:
    """Why ``req`` is too old (or too new) to apply at ``now``; None when it is fresh.

    Milliseconds are compared as integers: an issued-at is whatever the signer wrote, and a
    wild one must be refused, not overflow a date.
    """
    if req.issued_at is None:
        return "expired: it has no issued-at (sent by an older release); send it again"
    age_ms = int(now.timestamp() * 1000) - req.issued_at
    if age_ms > expiry // _MS:
        return f"expired: issued {_span(age_ms)} ago, the expiry is {_span(expiry // _MS)}"
    if -age_ms > OPERATOR_CLOCK_SKEW // _MS:
        return (
            f"issued {_span(-age_ms)} ahead of the processor's clock, more than the "
            f"{_span(OPERATOR_CLOCK_SKEW // _MS)} of clock skew allowed"
        )
    return None


_MS = timedelta(milliseconds=1)


def _span(ms: int) -> str:
    """A duration in milliseconds as people read it: ``1h02m03s``, ``20m00s``, ``42s``."""
    minutes, seconds = divmod(ms // 1000, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{seconds:02d}s"
    if minutes:
        return f"{minutes}m{seconds:02d}s"
    return f"{seconds}s"


def _row_of(ws: WriteSet, w: Working, item: Item, history: int) -> HistoryRow | None:
    """The history row ``item`` was recorded with, written from index ``history`` on."""
    key = (w.bound.saga_type, w.saga_id)
    return next(
        (
            h
            for h in ws.history[history:]
            if h.message_id == item.message_id and (h.saga_type, h.saga_id) == key
        ),
        None,
    )


def _audit(
    ws: WriteSet,
    w: Working,
    item: Item,
    op: Operator,
    decided: HistoryRow,
    history: int,
    audit: int,
) -> None:
    """Records the operator's request in the audit table, in the batch that decided it.

    The entry rides the same write as the request's history row, so it is stored exactly when
    the decision is: a batch that does not commit leaves neither, and a redelivered request is
    a duplicate that reaches no decision. A request held behind a parked saga is decided (and
    recorded) when a retry replays it: after the retry's entry, which goes before those of the
    requests it replayed (``history`` and ``audit`` are the lengths before the request;
    ``decided`` is the request's own row).
    """
    req = op.request
    key = (w.bound.saga_type, w.saga_id)
    rows = [h for h in ws.history[history:] if (h.saga_type, h.saga_id) == key]
    # `audit list --batch` and the batch's own wait find its requests by their batch.
    target: dict[str, Any] = {
        "request": item.message_id,
        **present(batch=req.batch, name=req.name, version=decided.version),
    }
    skipped = [h.message_id for h in rows if h.outcome is Outcome.SKIPPED]
    if skipped:
        target["skipped"] = skipped
    ws.audit.insert(
        audit,
        AuditEntry(
            req.by,
            str(req.action),
            req.reason,
            w.bound.saga_type,
            w.saga_id,
            target,
            str(decided.outcome),
        ),
    )


def _drop_skipped_deadline(w: Working, fired: FiredDeadline, loaded: Loaded) -> None:
    """A skipped fired deadline is consumed: its row goes, as an applied one's would.

    Left in place, the row stays marked dispatched and fires again only when the lease moves
    to another token, or never. Only the row this record fired is dropped: a deadline of the
    same name scheduled after it (another id) stays.
    """
    row = loaded.deadlines.get(fired.deadline_id)
    if row is not None and (row.saga_type, row.saga_id, row.name) == (
        fired.saga_type,
        fired.saga_id,
        fired.name,
    ):
        w.deadline_ops[fired.name] = None
        w.dirty = True


def _where(record: Record) -> str:
    message_id = record.header(HEADER_MESSAGE_ID) or "-"
    return f"{message_id} ({record.topic}[{record.partition}]@{record.offset})"
