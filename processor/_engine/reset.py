"""An operator's reset (``saga reset``): the saga rebuilt before one input, the rest replayed.

For a saga a handler bug sent the wrong way, once the fix is deployed. The saga is rebuilt from
its history as it was just before the chosen input: its inputs up to there run again with the
code running now, quietly (their commands were sent when they first applied; they are not sent
again). Then the chosen input and every later one replay as live inputs: their commands go to the
outbox and their history rows say ``replayed``. Deadlines are the rebuilt saga's: every stored
one goes, those the replay schedules count from the reset, and a fired deadline in the history
runs again only if the rebuilt saga still waits for it.

The reset is refused, changing nothing, when the history cannot rebuild the saga (retention
purged its first inputs, or it keeps no payloads), when a replayed input fails, or when the
replay would send again a command of a kind those inputs already sent (same type to the same
topic) unless the operator said so (``{"resend": true}``). It runs in the saga's log order, like
every operator record, all or nothing within its batch; the history and the audit trail name it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter
from collections.abc import Callable, Sequence

from processor._authoring.messages import MessageRegistry
from processor._engine.decode import FiredDeadline, Operator, Rejected, decode
from processor._engine.inject import as_event
from processor._engine.output import RowWriter
from processor._engine.records import Record
from processor._engine.route import Router
from processor._engine.rows import PARKED, Outcome, PastInput, WriteSet
from processor._engine.steps import DeadlineSteps
from processor._engine.working import Item, Pass, Working
from processor._wire import HEADER_MESSAGE_TYPE, OperatorAction, OperatorRecord

__all__ = ["Resets", "effective"]

# Operator inputs a reset does not run again: a retry's effect is the rows of what it replayed,
# which follow it; an earlier reset's is the cut it made (see `effective`).
_NOT_REPLAYED = frozenset(
    f"operator:{a}"
    for a in (OperatorAction.PARKED_RETRY, OperatorAction.PARKED_SKIP, OperatorAction.RESET)
)

Step = Callable[[Pass, Working, Item], None]


def effective(history: Sequence[PastInput]) -> list[PastInput] | str:
    """The inputs the saga's state stands on now, oldest first; or why the history cannot say.

    An earlier reset cut the inputs from the one it reset before; the rows it replayed follow
    it in the history (as many as its effects count). Retention purges replayed rows of an
    ended saga before its applied ones: a reset whose replayed rows are gone leaves a gap.
    """
    inputs: list[PastInput] = []
    owed = 0  # replayed rows the last reset counted and the history has not shown yet
    for past in history:
        replayed = past.outcome == Outcome.REPLAYED
        if owed and not replayed:
            return "retention purged the inputs an earlier reset replayed"
        owed -= 1 if replayed else 0
        if past.message_type == f"operator:{OperatorAction.RESET}":
            reset = (past.effects or {}).get("reset", {})
            cut = str(reset.get("before", ""))
            at = next((n for n, p in enumerate(inputs) if p.message_id == cut), None)
            if at is not None:
                del inputs[at:]
            owed = int(reset.get("replayed", 0))
        elif past.message_type not in _NOT_REPLAYED:
            inputs.append(past)
    return "retention purged the inputs an earlier reset replayed" if owed else inputs


class Resets:
    """Plans an operator's reset of one saga within the batch that consumes the request.

    Args:
        writer: Builds the history rows.
        router: Routes the rebuilt records (an operator record's signature is checked again).
        registry: Message types, to decode them.
        deadlines: Runs a replayed fired deadline against the rebuilt saga.
    """

    def __init__(
        self,
        writer: RowWriter,
        router: Router,
        registry: MessageRegistry,
        deadlines: DeadlineSteps,
    ) -> None:
        self._history = writer.history
        self._route = router.route
        self._registry = registry
        self._refire = deadlines.refire

    def reset(self, p: Pass, w: Working, item: Item, label: str, step: Step) -> None:
        """Rebuilds ``w`` before the request's input and replays from there, or refuses."""
        assert isinstance(item.decoded, Operator)
        req = item.decoded.request
        before = req.name or ""
        if w.status is None:
            self._history(p.ws, w, item, Outcome.NO_SAGA, detail=label)
            return
        why = self._refusal(w)
        if why is not None:
            self._refuse(p.ws, w, item, label, why)
            return
        inputs = effective(p.loaded.history.get((w.bound.saga_type, w.saga_id), ()))
        if isinstance(inputs, str):
            self._refuse(p.ws, w, item, label, inputs)
            return
        at = next((n for n, past in enumerate(inputs) if past.message_id == before), None)
        if at is None:
            why = f"{before[:200]!r} is no input the saga stands on (`show` lists them)"
            self._refuse(p.ws, w, item, label, why)
            return
        why = _incomplete(inputs)
        if why is not None:
            self._refuse(p.ws, w, item, label, why)
            return
        items: list[Item] = []
        for past in inputs:
            rebuilt = self._item(past, w, item)
            if isinstance(rebuilt, str):
                self._refuse(p.ws, w, item, label, f"{past.message_id}: {rebuilt}")
                return
            items.append(rebuilt)
        fresh = dataclasses.replace(
            w,
            state=None,
            status=None,
            # One version for the reset's own row; the replayed inputs count on from it.
            version=w.version + 1,
            parked_reason=None,
            dirty=True,
            # Every stored deadline goes; the rebuilt saga's own schedules replace them.
            deadline_ops={
                d.name: None
                for d in p.loaded.deadlines.values()
                if (d.saga_type, d.saga_id) == (w.bound.saga_type, w.saga_id)
            },
            cleared=False,
            outcome=None,
            waiting=None,
        )
        seen: set[tuple[str, str, str]] = set()
        quiet = WriteSet()
        rebuild = Pass(quiet, p.loaded, p.now, seen, True)
        for n, x in enumerate(items[:at]):
            self._run(rebuild, fresh, x, step)
            if quiet.parked or fresh.status is None:
                why = quiet.parked[0].reason if quiet.parked else "it did not start the saga"
                self._refuse(p.ws, w, item, label, f"rebuilding at {inputs[n].message_id}: {why}")
                return
        live = WriteSet()
        replay = Pass(live, p.loaded, p.now, seen, True)
        self._history(live, fresh, item, Outcome.APPLIED, version=fresh.version, detail=label)
        for n, x in enumerate(items[at:], start=at):
            self._run(replay, fresh, x, step)
            if live.parked:
                why = f"replaying {inputs[n].message_id}: {live.parked[0].reason}"
                self._refuse(p.ws, w, item, label, why)
                return
        again = _sent_again(inputs[at:], live)
        if again and not _resend(req):
            why = (
                f"the replay would send again {again} (the replayed inputs sent them); "
                "send the reset with --resend to send them anyway"
            )
            self._refuse(p.ws, w, item, label, why)
            return
        own, *rows = live.history
        replayed = [r for r in rows if r.outcome is Outcome.APPLIED]
        for row in replayed:
            row.outcome = Outcome.REPLAYED
        # What `effective` reads back: the cut, and how many replayed rows follow this one.
        own.effects = {"reset": {"before": before, "rebuilt": at, "replayed": len(replayed)}}
        # Operator inputs replayed were audited when they first applied; the reset is, by its
        # caller.
        live.audit.clear()
        p.ws.extend(live)
        p.ws.wake_deadlines = True
        for f in dataclasses.fields(Working):
            setattr(w, f.name, getattr(fresh, f.name))

    def _run(self, p: Pass, w: Working, x: Item, step: Step) -> None:
        if isinstance(x.decoded, FiredDeadline):
            self._refire(p, w, x, x.decoded)
        else:
            step(p, w, x)

    def _refusal(self, w: Working) -> str | None:
        """Why ``w`` (a started saga, active or ended) cannot be reset; None if it can."""
        if w.status == PARKED:
            return "the saga is parked: retry or skip it first (`parked retry`)"
        if w.load_error is not None:
            return f"its state does not load: {w.load_error}"
        return None

    def _refuse(self, ws: WriteSet, w: Working, item: Item, label: str, why: str) -> None:
        detail = f"{label} ({why}); nothing changed"[:2000]
        self._history(ws, w, item, Outcome.OPERATOR_REFUSED, detail=detail)

    def _item(self, past: PastInput, w: Working, reset: Item) -> Item | str:
        """The input ``past`` as an item for ``w``, at the reset's place in the log."""
        if past.payload is None or past.headers is None:
            return "the history keeps no copy of it (SAGA_HISTORY__PAYLOAD=full keeps them)"
        at = reset.decoded.record
        record = Record(
            topic=at.topic,
            partition=at.partition,
            offset=at.offset,
            key=w.saga_id.encode(),
            value=past.payload,
            headers=tuple((k, v.encode()) for k, v in past.headers.items()),
        )
        if past.kind == "event" and past.message_id.startswith("operator:"):
            # An injected event: its row keeps the request's value, which holds the event.
            try:
                request = OperatorRecord.parse(past.payload)
            except ValueError:
                return "its injected event no longer reads"
            op = Operator(record, request, None)
            return as_event(self._registry, w, Item(op, w.bound, w.saga_id), op)
        routed, _ = self._route([decode(record, self._registry, sys.maxsize)])
        key = (w.bound.saga_type, w.saga_id)
        for x in routed:
            if isinstance(x, Rejected):
                return f"it no longer reads: {x.reason}"
            if (x.bound.saga_type, x.saga_id) == key:
                return x
        return "it no longer routes to this saga"


def _incomplete(inputs: Sequence[PastInput]) -> str | None:
    """Why ``inputs`` cannot rebuild the saga; None when they start with its first input."""
    if not inputs or inputs[0].version != 1:
        return (
            "its history no longer holds the input that started it (retention purged it): "
            "nothing to rebuild from"
        )
    return None


def _sent_again(replayed: Sequence[PastInput], live: WriteSet) -> str | None:
    """The commands the replay sends of kinds the replayed inputs sent before, as text."""
    before = Counter(
        (str(c.get("type")), str(c.get("topic")))
        for past in replayed
        for c in (past.effects or {}).get("commands", ())
    )
    now = Counter((r.headers.get(HEADER_MESSAGE_TYPE, ""), r.topic) for r in live.outbox)
    both = before & now
    if not both:
        return None
    return ", ".join(f"{n} {t} to {topic}" for (t, topic), n in sorted(both.items()))


def _resend(req: OperatorRecord) -> bool:
    try:
        options = json.loads(req.message or "{}")
    except ValueError:
        return False
    return isinstance(options, dict) and options.get("resend") is True
