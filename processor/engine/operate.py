"""Operator records in the planner: routed by their signature, applied in the saga's log order."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from processor.engine.decode import (
    Operator,
    Reason,
    Rejected,
)
from processor.engine.rows import (
    ENDED,
    PARKED,
    Outcome,
    Wants,
    WriteSet,
)
from processor.engine.steps import Steps
from processor.engine.working import Item, Working
from processor.wire import OperatorAction, operator_signed


class OperatorSteps(Steps):
    """Routes and applies operator records (a base of ``Planner``)."""

    def _route_operator(self, d: Operator, wants: Wants) -> Item | Rejected:
        req = d.request
        if self._operator_key is None or not operator_signed(
            self._operator_key, d.record.value or b"", d.signature
        ):
            return Rejected(d.record, Reason.UNAUTHENTICATED, "bad or missing operator-auth")
        bound = self._sagas.get(req.saga_type)
        if bound is None:
            return Rejected(d.record, Reason.UNKNOWN_TYPE, f"no saga type {req.saga_type!r}")
        key = (req.saga_type, req.saga_id)
        wants.saga_keys.add(key)
        wants.message_keys.add((*key, req.message_id))
        return Item(d, bound, req.saga_id)

    def _operate(
        self,
        ws: WriteSet,
        w: Working,
        item: Item,
        op: Operator,
        now: datetime,
        seen: set[tuple[str, str, str]],
        mkey: tuple[str, str, str],
    ) -> None:
        """Applies an operator's request in the saga's log order, like one of its events."""
        req = op.request
        label = f"operator {req.action} by {req.by}: {req.reason}"[:1000]
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
            call = lambda: w.bound.handle_cancel(state, w.saga_id, label, req.reason, now)  # noqa: E731
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
