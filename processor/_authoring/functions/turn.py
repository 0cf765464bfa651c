"""One handler run of a saga function: resolve its pending await, then run it to the next one.

A run first decides, from the stored :class:`Pending` alone, what the input does: resolve the
await (a reply, its timer, a person's decision, a cancel, the saga deadline), retry it (its
command sent again: no function code runs), or nothing (a late or stray event). Only a
resolution runs the function: resumed in memory when this replica still holds it suspended at
exactly this place of the journal, else replayed from its start against the journal.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from processor._authoring.functions.context import (
    Nondeterminism,
    Op,
    SagaContext,
    StepFailed,
    _Await,
)
from processor._authoring.functions.journal import (
    Entry,
    FunctionState,
    Pending,
    Resolution,
    TimerPayload,
    Wire,
    chain_after,
)
from processor._authoring.handles import SagaCommands, SagaDeadlines, SagaLifecycle, SagaOutcome
from processor._authoring.messages import Message, registry
from processor._authoring.orchestration.steps import Escalation
from processor._errors import SagaError

__all__ = ["DEADLINE", "TIMER", "FunctionSpec", "Suspended", "Turn"]

TIMER = "function.timer"
"""The deadline an await's timeout, backoff or sleep is (one at a time: awaits are in turn)."""
DEADLINE = "function.deadline"
"""The saga's own deadline (``@saga_function(sla=...)``)."""

_IN_DOUBT: tuple[Resolution, ...] = ("timed-out", "cancelled", "deadline")
_LATE_KEPT = 50


class Suspended:
    """Suspended functions this replica keeps, one a saga; bounded, oldest out.

    One a saga: a saga's function is suspended at one place at a time, and the place it was
    suspended at before can never be resumed again (its journal only grows), so keeping the
    newest under the saga's id is enough, and a saga's end forgets it in one look-up.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # By saga id: the journal place (chain), the coroutine, its context, its deps' ids.
        self._items: OrderedDict[str, tuple[str, Any, SagaContext, tuple[int, ...]]] = OrderedDict()
        self.hits = 0
        self.replays = 0

    def take(
        self, saga_id: str, chain: str, deps: tuple[int, ...]
    ) -> tuple[Any, SagaContext] | None:
        """The function suspended at ``chain``, removed, or None (then the caller replays).

        The saga's function held at another place is removed too: the caller's replay puts
        the function it suspends in its stead.
        """
        with self._lock:
            item = self._items.pop(saga_id, None)
        if item is None or item[0] != chain or item[3] != deps:
            self.replays += 1
            return None
        self.hits += 1
        return item[1], item[2]

    def put(
        self,
        saga_id: str,
        chain: str,
        coro: Any,
        ctx: SagaContext,
        deps: tuple[int, ...],
        size: int,
    ) -> None:
        """Keep a suspended function; the oldest go past ``size`` (0 keeps none)."""
        if size <= 0:
            return
        with self._lock:
            self._items[saga_id] = (chain, coro, ctx, deps)
            self._items.move_to_end(saga_id)
            while len(self._items) > size:
                self._items.popitem(last=False)

    def drop(self, saga_id: str) -> None:
        """Forget the function of ``saga_id`` (it ended)."""
        with self._lock:
            self._items.pop(saga_id, None)

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class FunctionSpec:
    """A saga function as declared: what runs, and what it runs with.

    Attributes:
        func: The ``async def``.
        saga_type: The saga's type.
        start: The start event class.
        decisions: The event class carrying a person's decision, if any.
        escalation: Builds the command that asks a person, from the start event and why.
        sla: The saga's own deadline, counted from its start.
        suspended: The functions this process keeps suspended.
        handled: Wire names of the events the saga's handlers take.
    """

    func: Callable[..., Coroutine[Any, Any, Any]]
    saga_type: str
    start: type[Message]
    decisions: type[Message] | None = None
    escalation: Callable[[Any, Escalation], Message] | None = None
    sla: timedelta | None = None
    suspended: Suspended = field(default_factory=Suspended)
    handled: frozenset[str] = frozenset()


class Turn:
    """One handler run of a saga function (see the module's docstring)."""

    def __init__(
        self,
        spec: FunctionSpec,
        state: FunctionState,
        saga_id: str,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        *,
        journal_limit: int,
    ) -> None:
        self.spec = spec
        self.state = state
        self.saga_id = saga_id
        self.commands = commands
        self.deadlines = deadlines
        self.lifecycle = lifecycle
        self.now = deadlines.now
        self.journal_limit = journal_limit
        self._open = True

    # -- what an input does to the pending await -------------------------------------------

    def begin(self, event: Message) -> bool:
        """The start event: keep it, arm the saga deadline, and run the function."""
        s = self.state
        if s.started_at is not None:
            self._late(f"{_name(event)} ignored: the saga has started")
            return False
        s.started_at = self.now
        s.chain = hashlib.blake2b(
            f"{self.saga_id}\x1f{self.now.isoformat()}".encode(), digest_size=16
        ).hexdigest()
        if self.spec.sla is not None:
            s.deadline_at = self.now + self.spec.sla
            self.deadlines.schedule(DEADLINE, at=s.deadline_at)
        return True

    def event(self, event: Message) -> bool:
        """A reply or event for the saga; True when it resolved the pending await."""
        p = self.state.pending
        name = _name(event)
        if p is None:
            return self._late(f"{name} ignored: nothing awaited it", event)
        if p.kind == "decision" and type(event) is self.spec.decisions:
            decision = str(getattr(event, "decision", ""))
            refusal = self.state.decision_refusal(decision)
            if refusal is not None:
                return self._late(f"{name} ignored: {refusal}")
            return self._resolve("decided", Wire.of(event), decision=decision)
        if name in p.expects:
            return self._resolve("ok", Wire.of(event))
        if p.kind in ("call", "undo") and name in p.rejects:
            return self._resolve("rejected", Wire.of(event))
        if p.kind in ("call", "undo") and name in p.retry_on and not p.backing_off:
            return self._attempt_failed(event)
        return self._late(f"{name} ignored at await #{p.seq} ({p.what})", event)

    def timer(self, seq: int, attempt: int) -> bool:
        """The await's timer fired: a timeout, the end of a backoff, or a sleep's end."""
        p = self.state.pending
        if p is None or p.seq != seq or p.attempt != attempt:
            return self._late(f"timer of await #{seq} attempt {attempt} ignored: not pending")
        if p.backing_off:
            self._send_attempt(p, p.attempt + 1)
            return False
        if p.kind == "sleep":
            return self._resolve("ok")
        if p.kind == "wait":
            return self._resolve("timed-out")
        if p.kind in ("call", "undo"):
            return self._attempt_failed(None)
        return self._late(f"timer of await #{seq} ignored: a {p.kind} has no timeout")

    def deadline(self) -> bool:
        """The saga's own deadline passed."""
        p = self.state.pending
        if p is None or self.state.compensating:
            return self._late("the saga deadline passed while compensating")
        return self._resolve("deadline")

    def cancel(self) -> bool:
        """An operator cancelled the saga."""
        return self._resolve("cancelled")

    def decide(self, decision: str) -> bool:
        """An operator's decision (``saga resolve``)."""
        return self._resolve("decided", decision=decision)

    def _attempt_failed(self, reply: Message | None) -> bool:
        p = self.state.pending
        assert p is not None
        at = None
        if p.retry is not None:
            # Undos are not capped by the saga deadline: they run after it has passed, and what
            # they undo stays stuck until they finish. Their own policy bounds them.
            end = self.state.deadline_at if p.kind != "undo" else None
            at = p.retry.next_attempt_at(
                p.attempt, self.now, f"{self.saga_id}:{p.seq}", budget_end=end
            )
        if at is None:
            outcome: Resolution = "failed" if reply is not None else "timed-out"
            return self._resolve(outcome, Wire.of(reply) if reply is not None else None)
        p.backing_off = True
        p.timer_at = at
        self.deadlines.schedule(TIMER, at=at, payload=TimerPayload(seq=p.seq, attempt=p.attempt))
        self.state.pending = p
        return False

    def _send_attempt(self, p: Pending, attempt: int) -> None:
        p.attempt = attempt
        p.backing_off = False
        p.timer_at = self.now + p.timeout if p.timeout is not None else None
        if p.command is not None:
            self.commands.send(p.command.load(), deadline=p.timer_at)
        if p.timer_at is not None:
            self.deadlines.schedule(
                TIMER, at=p.timer_at, payload=TimerPayload(seq=p.seq, attempt=attempt)
            )
        self.state.pending = p

    def _resolve(
        self, outcome: Resolution, result: Wire | None = None, *, decision: str | None = None
    ) -> bool:
        p = self.state.pending
        if p is None:
            return False
        in_doubt = p.kind == "call" and outcome in _IN_DOUBT
        entry = Entry(
            seq=p.seq,
            kind=p.kind,
            what=p.what,
            command=p.command,
            result=result,
            outcome=outcome,
            decision=decision,
            attempts=p.attempt,
            undo=p.undo if in_doubt else None,
            expects=p.expects if in_doubt and p.undo is not None else [],
            at=self.now,
        )
        if p.timer_at is not None:
            self.deadlines.cancel(TIMER)
        self.state.pending = None
        self._append(entry)
        return True

    def _late(self, note: str, event: Message | None = None) -> bool:
        s = self.state
        if event is not None:
            name = _name(event)
            for entry in reversed(s.journal):
                if entry.undo is not None and name in entry.expects:
                    done = f"late {name} for await #{entry.seq}: undo sent"
                    # The function took that late success itself (its compensation listens for
                    # it and undoes it): this is a copy, not a second success.
                    taken = any(
                        e.seq > entry.seq and e.result is not None and e.result.type == name
                        for e in s.journal
                    )
                    if done not in s.late and not taken:
                        self.commands.send(entry.undo.load())
                        note = done
                    break
        s.late = [*s.late, note][-_LATE_KEPT:]
        return False

    # -- the function's operations, as the context asks for them -----------------------------

    def step(self, ctx: SagaContext, op: Op) -> Entry | None:
        """The entry of ``op``'s place when the journal holds it, else None (suspend there)."""
        seq, label, recorded = self._place(ctx, op)
        if isinstance(recorded, Entry):
            return recorded
        if recorded is None:
            self._issue(seq, op, label)
        return None

    def sent(self, ctx: SagaContext, op: Op) -> None:
        """A command sent without waiting: sent now, or (on replay) checked against the journal."""
        seq, label, recorded = self._place(ctx, op)
        if isinstance(recorded, Entry):
            return
        assert op.command is not None
        self.commands.send(op.command)
        self._append(
            Entry(seq=seq, kind="send", what=label, command=Wire.of(op.command), at=self.now)
        )

    def _place(self, ctx: SagaContext, op: Op) -> tuple[int, str, Entry | Pending | None]:
        """Takes ``op``'s place: what was recorded there (checked against ``op``), or None.

        The journal's entry, or the pending await; None where the function goes further than
        it ever went.
        """
        self._check_open()
        m = ctx._m
        seq = m.position
        m.position += 1
        label = _label(op)
        journal = self.state.journal
        recorded = journal[seq] if seq < len(journal) else self.state.pending
        if recorded is not None:
            self._same(seq, op, label, recorded.kind, recorded.what, recorded.command)
        return seq, label, recorded

    def patched(self, ctx: SagaContext, name: str) -> bool:
        """Whether the code under patch ``name`` runs here (see ``SagaContext.patched``)."""
        self._check_open()
        m = ctx._m
        seq = m.position
        journal = self.state.journal
        if seq < len(journal):
            e = journal[seq]
            if e.kind == "patch" and e.what == name:
                m.position += 1
                return True
            return False
        if self.state.pending is not None:
            return False
        m.position += 1
        self._append(Entry(seq=seq, kind="patch", what=name, at=self.now))
        return True

    def escalation(self, start: Message, escalation: Escalation) -> Message | None:
        """The command asking a person, built as the saga declared (None: it declared none)."""
        build = self.spec.escalation
        return None if build is None else build(start, escalation)

    def _issue(self, seq: int, op: Op, label: str) -> None:
        unknown = [
            _wire_name(c)
            for c in (*op.expects, *op.rejects, *op.retry_on)
            if _wire_name(c) not in self.spec.handled
        ]
        if unknown:
            raise SagaError(
                f"await #{seq} ({label}) waits for {', '.join(unknown)}, which the saga does "
                "not take; name the classes in expects=/rejects=/retry_on=/wait(), or list "
                "them in @saga_function(events=...)"
            )
        timer_at = None
        if op.kind == "sleep":
            timer_at = op.until
        elif op.timeout is not None:
            timer_at = self.now + op.timeout
        p = Pending(
            seq=seq,
            kind=op.kind,
            what=label,
            command=Wire.of(op.command) if op.command is not None else None,
            expects=[_wire_name(c) for c in op.expects],
            rejects=[_wire_name(c) for c in op.rejects],
            retry_on=[_wire_name(c) for c in op.retry_on],
            timeout=op.timeout,
            retry=op.retry,
            timer_at=timer_at,
            since=self.now,
            undo=Wire.of(op.undo.command) if op.undo is not None else None,
            reason=op.reason,
        )
        if op.command is not None:
            self.commands.send(op.command, deadline=timer_at if op.kind != "sleep" else None)
        if timer_at is not None:
            self.deadlines.schedule(TIMER, at=timer_at, payload=TimerPayload(seq=seq, attempt=1))
        self.state.pending = p

    def _same(
        self, seq: int, op: Op, label: str, kind: str, what: str, command: Wire | None
    ) -> None:
        mine = Wire.of(op.command) if op.command is not None else None
        if kind == op.kind and what == label and mine == command:
            return
        recorded = command.describe() if command is not None else what
        asked = mine.describe() if mine is not None else label
        raise Nondeterminism(
            f"await #{seq}: the function now asks for {op.kind} {asked}, but its journal "
            f"recorded {kind} {recorded}; guard the change with ctx.patched(...) so sagas "
            "already past this place keep the old code"
        )

    def _append(self, entry: Entry) -> None:
        s = self.state
        if len(s.journal) >= self.journal_limit:
            raise SagaError(
                f"the journal holds {len(s.journal)} entries, the limit "
                f"(saga_functions.journal_limit); a function this long is better split, or "
                "the limit raised"
            )
        s.journal.append(entry)
        s.chain = chain_after(s.chain, entry)

    def _check_open(self) -> None:
        if not self._open:
            raise SagaError("a saga function ran an operation outside its handler run")

    # -- running the function ----------------------------------------------------------------

    def run(
        self, start: Message, kwargs: dict[str, Any], cache_size: int, chain_before: str
    ) -> None:
        """Run the function from where it is suspended (or from its start) to its next await."""
        spec = self.spec
        s = self.state
        deps = tuple(id(v) for v in kwargs.values())
        held = spec.suspended.take(self.saga_id, chain_before, deps) if chain_before else None
        try:
            if held is not None:
                coro, ctx = held
                ctx._turn = self
                sent: Any = (
                    s.journal[-1]
                    if s.journal and s.journal[-1].seq == ctx._m.position - 1
                    else None
                )
                if sent is None:
                    coro.close()
                    held = None
            if held is None:
                assert s.started_at is not None
                ctx = SagaContext(self.saga_id, start, s.started_at, self)
                coro = _program(spec.func, ctx, start, kwargs)
                sent = None
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                self._finish(ctx, stop.value)
                return
            except BaseException:
                coro.close()
                raise
            if not isinstance(yielded, _Await) or yielded._ctx is not ctx:
                coro.close()
                raise SagaError(
                    f"a saga function awaits only its context's operations (call, sleep, "
                    f"until, wait, compensate, escalate), not {type(yielded).__qualname__}; "
                    "it does no I/O of its own"
                )
            self._keep(ctx)
            ctx._turn = _DETACHED
            spec.suspended.put(self.saga_id, s.chain, coro, ctx, deps, cache_size)
        finally:
            self._open = False

    def _keep(self, ctx: SagaContext) -> None:
        self.state.compensating = ctx._m.compensating
        self.state.aborted = ctx._m.aborted

    def _finish(self, ctx: SagaContext, value: Any) -> None:
        self._keep(ctx)
        if self.state.deadline_at is not None:
            self.deadlines.cancel(DEADLINE)
        self.lifecycle.end(value if value is not None else SagaOutcome.COMPLETED)
        self.spec.suspended.drop(self.saga_id)


class _Detached:
    """The turn of a function held suspended between handler runs: it refuses every operation.

    A held function keeps no handler run: the run's state, handles and saga state would stay
    alive for as long as it is held (about half the objects it holds), and the garbage
    collector walks every one at each of its full collections. A resume attaches its own run.
    """

    def _refuse(self, *_: Any) -> Any:
        raise SagaError("a saga function ran an operation outside its handler run")

    step = sent = patched = escalation = _refuse


_DETACHED = _Detached()


async def _program(
    func: Callable[..., Coroutine[Any, Any, Any]],
    ctx: SagaContext,
    start: Message,
    kwargs: dict[str, Any],
) -> SagaOutcome | str | None:
    """The function, and its undos if a failure escapes it."""
    try:
        result = await func(ctx, start, **kwargs)
    except StepFailed as failure:
        ctx._m.aborted = str(failure)
        await ctx.compensate()
        if failure.outcome is SagaOutcome.COMPENSATED and not ctx._m.undone:
            # Nothing had been done that needed undoing: the saga failed, as an orchestrated
            # saga whose first step is refused does.
            return SagaOutcome.FAILED
        return failure.outcome
    if result is None or isinstance(result, SagaOutcome):
        return result
    return SagaOutcome(str(result))


def _name(event: Message) -> str:
    return _wire_name(type(event))


def _wire_name(cls: type[Message]) -> str:
    return registry.of(cls).name


def _label(op: Op) -> str:
    if op.command is not None:
        return _name(op.command)
    if op.kind == "wait":
        return "|".join(_wire_name(c) for c in op.expects)
    return op.what
