"""What a saga function awaits: the context's operations, and the failures they raise.

Every operation that has an effect or waits takes the next place in the saga's journal. On a
replay the operation at a place the journal already holds returns (or raises) what the journal
recorded, after checking that the function asked for the same thing; at the first place it does
not hold, the operation is issued (its command sent, its timer scheduled) and the function is
suspended there until an event, a timer or an operator resolves it.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from collections.abc import Generator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from processor._authoring.handles import SagaOutcome
from processor._authoring.messages import Message
from processor._authoring.orchestration.retry import RetryPolicy
from processor._authoring.orchestration.steps import Escalation
from processor._errors import SagaError

if TYPE_CHECKING:
    from processor._authoring.functions.journal import Entry


class Turn(Protocol):
    """What the context asks of the handler run it is in (``turn.Turn``)."""

    def step(self, ctx: SagaContext, op: Op) -> Entry | None: ...
    def sent(self, ctx: SagaContext, op: Op) -> None: ...
    def patched(self, ctx: SagaContext, name: str) -> bool: ...
    def escalation(self, start: Message, escalation: Escalation) -> Message | None: ...


__all__ = [
    "Cancelled",
    "DeadlinePassed",
    "Nondeterminism",
    "Op",
    "Rejected",
    "SagaContext",
    "StepFailed",
    "TimedOut",
    "Undo",
]

_T = TypeVar("_T")
_E = TypeVar("_E", bound=Message)

Events = type[Message] | tuple[type[Message], ...]


class StepFailed(Exception):
    """An await of the saga cannot succeed; escaping the function, it runs the undos in reverse.

    Attributes:
        kind: ``"rejected"`` (a reply in ``rejects``), ``"failed"`` (a reply in
            ``retry_on``, retries spent), ``"timed-out"``, ``"cancelled"`` (``saga cancel``)
            or ``"deadline"`` (the saga's own deadline passed).
        what: The await (its command's or event's wire name).
        reason: Why, in words.
        reply: The reply that said so, if one did.
        outcome: How the saga ends once its undos ran.
    """

    outcome = SagaOutcome.COMPENSATED
    kind = "failed"

    def __init__(self, what: str, reason: str, reply: Message | None = None) -> None:
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason
        self.reply = reply


class Rejected(StepFailed):
    """A participant refused: the reply is one the call named in ``rejects``."""

    kind = "rejected"


class TimedOut(StepFailed):
    """No reply came in time, on any attempt."""

    kind = "timed-out"


class DeadlinePassed(StepFailed):
    """The saga's own deadline (``@saga_function(..., sla=...)``) passed first."""

    outcome = SagaOutcome.TIMED_OUT
    kind = "deadline"


class Cancelled(StepFailed):
    """An operator cancelled the saga (``saga cancel``)."""

    outcome = SagaOutcome.CANCELLED
    kind = "cancelled"


class Nondeterminism(SagaError):
    """The function asked, at a place of its journal, for something other than it recorded."""


@dataclass(frozen=True)
class Undo:
    """The command that undoes a call, and the replies that say how the undo went.

    Give it to ``call(..., undo=Undo(...))``: once the call succeeds the undo is registered, and
    a failure escaping the function runs the registered undos, newest first. A failed undo asks
    a person (``@saga_function(escalation=...)``), who decides to ``retry`` it or ``skip`` it
    as done by hand.

    Attributes:
        command: The undo command.
        expects: The reply (or replies) saying it is undone.
        rejects: Replies saying it could not be undone.
        timeout: How long each attempt waits.
        retry: How often it is tried again before a person is asked.
        late_window: When the call's outcome is unknown (it timed out, the saga was cancelled
            or ran out of time while it waited), how long the compensation keeps listening for
            its late success, to undo that too.
    """

    command: Message
    expects: Events
    rejects: Events = ()
    timeout: timedelta | None = None
    retry: RetryPolicy | None = None
    late_window: timedelta = timedelta(minutes=10)


@dataclass(frozen=True)
class Op:
    """One operation as the journal sees it (built by :class:`SagaContext`)."""

    kind: str
    what: str
    command: Message | None = None
    expects: tuple[type[Message], ...] = ()
    rejects: tuple[type[Message], ...] = ()
    retry_on: tuple[type[Message], ...] = ()
    timeout: timedelta | None = None
    retry: RetryPolicy | None = None
    undo: Undo | None = None
    until: datetime | None = None
    reason: str | None = None


class _Await(Generic[_T]):
    """What an operation returns: awaiting it replays the journal's result or suspends."""

    __slots__ = ("_ctx", "_op")

    def __init__(self, ctx: SagaContext, op: Op) -> None:
        self._ctx = ctx
        self._op = op

    def __await__(self) -> Generator[Any, Any, _T]:
        ctx = self._ctx
        entry = ctx._turn.step(ctx, self._op)
        if entry is None:
            # Suspended: the driver keeps the coroutine (or drops it and replays later); a
            # resume sends the entry that resolved this await.
            entry = yield self
        result: _T = ctx._settle(self._op, entry)
        return result


def _classes(events: Events, what: str) -> tuple[type[Message], ...]:
    found = events if isinstance(events, tuple) else (events,)
    for cls in found:
        if not (isinstance(cls, type) and issubclass(cls, Message)):
            raise SagaError(f"{what} takes message classes, got {cls!r}")
    return found


@dataclass
class _Memory:
    """What the function built up as it ran, kept with a suspended function."""

    position: int = 0
    now: datetime | None = None
    undos: list[Undo] = field(default_factory=list)
    compensating: bool = False
    aborted: str | None = None
    drawn: int = 0
    undone: int = 0
    # Calls whose outcome is unknown, with their undo: a late success is undone too.
    in_doubt: list[tuple[tuple[type[Message], ...], Undo]] = field(default_factory=list)


class SagaContext:
    """What a saga function is given first: its clock, its ids, and every operation it awaits.

    Attributes:
        saga_id: The saga's id (the start event's association value).
        start: The event that started the saga.
    """

    def __init__(self, saga_id: str, start: Message, started_at: datetime, turn: Turn) -> None:
        self.saga_id = saga_id
        self.start = start
        self._started_at = started_at
        self._turn = turn
        self._m = _Memory(now=started_at)

    # -- the clock, randomness and ids: the same on every replay ---------------------------

    @property
    def now(self) -> datetime:
        """The saga's clock: when the await the function last passed was resolved."""
        assert self._m.now is not None
        return self._m.now

    def random(self) -> random.Random:
        """A random generator seeded by the saga and the function's place: the same on replay."""
        self._m.drawn += 1
        return random.Random(self._seed(f"random#{self._m.drawn}"))

    def uuid(self) -> str:
        """A fresh id, the same on every replay of this place of the function."""
        self._m.drawn += 1
        return str(uuid.UUID(bytes=self._seed(f"uuid#{self._m.drawn}")[:16], version=4))

    def _seed(self, what: str) -> bytes:
        text = f"{self.saga_id}\x1f{self._started_at.isoformat()}\x1f{what}"
        return hashlib.blake2b(text.encode(), digest_size=16).digest()

    # -- operations ------------------------------------------------------------------------

    def call(
        self,
        command: Message,
        *,
        expects: type[_E] | tuple[type[_E], ...],
        rejects: Events = (),
        retry_on: Events = (),
        timeout: timedelta | None = None,
        retry: RetryPolicy | None = None,
        undo: Undo | None = None,
    ) -> _Await[_E]:
        """Send ``command`` and wait for its reply.

        Args:
            command: The command; its message id is stable, so a relay re-send is deduped.
            expects: The reply (or replies) that mean it worked; awaiting returns it.
            rejects: Replies that mean a refusal: :class:`Rejected` is raised, never retried.
            retry_on: Replies that mean this attempt failed: it is tried again per ``retry``,
                then :class:`StepFailed` is raised.
            timeout: How long each attempt waits; then it is tried again per ``retry``, then
                :class:`TimedOut` is raised. None waits until a reply (or the saga deadline).
            retry: Attempts and backoff (the command must be safe to receive twice).
            undo: What undoes the call: registered once it succeeds, sent if its success
                turns up after it timed out.
        """
        return _Await(
            self,
            Op(
                "call",
                "",
                command,
                _classes(expects, "expects="),
                _classes(rejects, "rejects="),
                _classes(retry_on, "retry_on="),
                timeout,
                retry,
                undo,
            ),
        )

    def send(self, command: Message) -> None:
        """Send ``command`` without waiting for anything (journaled: a replay sends nothing)."""
        self._turn.sent(self, Op("send", "", command))

    def sleep(self, delay: timedelta) -> _Await[None]:
        """Wait ``delay`` on the saga's clock (a deadline through the saga's partition)."""
        return self.until(self.now + delay)

    def until(self, at: datetime) -> _Await[None]:
        """Wait until ``at`` (timezone-aware)."""
        if at.tzinfo is None:
            raise SagaError("until() takes a timezone-aware datetime")
        return _Await(self, Op("sleep", "timer", until=at))

    def wait(
        self, events: type[_E] | tuple[type[_E], ...], *, timeout: timedelta | None = None
    ) -> _Await[_E | None]:
        """Wait for an event for this saga (a person's decision, a payment arriving).

        Returns:
            The event, or None if ``timeout`` passed first.
        """
        return _Await(self, Op("wait", "", None, _classes(events, "wait()"), timeout=timeout))

    def on_undo(self, undo: Undo) -> None:
        """Register an undo by hand (``call(..., undo=...)`` registers one on success)."""
        self._m.undos.append(undo)

    async def compensate(self) -> None:
        """Run the registered undos, newest first; a failed one asks a person what to do.

        A failure escaping the function does this by itself; call it to compensate and then
        go on (or return an outcome of your own).
        """
        self._m.compensating = True
        while self._m.undos:
            await self._undo(self._m.undos.pop())
        # As an orchestrated saga does: a call whose outcome is unknown may still succeed;
        # listen for that success for its late window, and undo it if it comes.
        while self._m.in_doubt:
            window = max(undo.late_window for _, undo in self._m.in_doubt)
            successes = tuple(dict.fromkeys(c for classes, _ in self._m.in_doubt for c in classes))
            late = await self.wait(successes, timeout=window)
            if late is None:
                break
            match = next(i for i, (c, _) in enumerate(self._m.in_doubt) if type(late) in c)
            _, undo = self._m.in_doubt.pop(match)
            await self._undo(undo)
        # The function may go on: a cancel, the deadline and a person's ask apply to it again.
        self._m.compensating = False

    async def _undo(self, undo: Undo) -> None:
        self._m.undone += 1
        while True:
            try:
                await _Await(self, _undo_op(undo))
                return
            except StepFailed as failure:
                escalation = Escalation(
                    reason="compensation-failed",
                    step=failure.what,
                    machine_state="COMPENSATING",
                    detail=f"undo {failure.what} failed: {failure.reason}",
                )
                if await self.escalate(escalation) == "skip":
                    return

    async def escalate(self, escalation: Escalation | str) -> str:
        """Ask a person, and wait for their decision: ``retry``, ``skip`` or ``compensate``.

        The escalation command (``@saga_function(escalation=...)``) is sent; the saga waits
        on a person until a decision event (``@saga_function(decisions=...)``) or
        ``saga resolve`` answers.
        """
        if isinstance(escalation, str):
            escalation = Escalation(
                reason="still-waiting", step=None, machine_state="RUNNING", detail=escalation
            )
        command = self._turn.escalation(self.start, escalation)
        if command is not None:
            self.send(command)
        op = Op("decision", "decision", reason=escalation.detail)
        decision: str = await _Await(self, op)
        return decision

    def patched(self, name: str) -> bool:
        """Whether this saga runs the code added under ``name`` (versioning).

        New sagas, and sagas that reach this place for the first time, take the new code
        (True, and the journal remembers it); a saga already past this place, or suspended
        on an await the old code issued here, keeps the old code (False).
        """
        return self._turn.patched(self, name)

    # -- what the awaits resolve to ---------------------------------------------------------

    def _settle(self, op: Op, entry: Entry) -> Any:
        self._m.now = entry.at
        reply = entry.result.load() if entry.result is not None else None
        what = entry.what
        if op.kind == "call" and op.undo is not None and entry.outcome in _IN_DOUBT:
            self._m.in_doubt.append((op.expects, op.undo))
        match entry.outcome:
            case "ok":
                if op.kind == "call" and op.undo is not None:
                    self._m.undos.append(op.undo)
                return reply
            case "decided":
                return entry.decision
            case "rejected":
                raise Rejected(what, _because(reply, "refused"), reply)
            case "failed":
                raise StepFailed(what, _because(reply, f"failed {entry.attempts} time(s)"), reply)
            case "timed-out":
                if op.kind == "wait":
                    return None
                raise TimedOut(what, f"no reply after {entry.attempts} attempt(s)")
            case "cancelled":
                raise Cancelled(what, "the saga was cancelled")
            case "deadline":
                raise DeadlinePassed(what, "the saga's deadline passed")
        raise SagaError(f"journal entry #{entry.seq} has an unknown outcome {entry.outcome!r}")


_IN_DOUBT = ("timed-out", "cancelled", "deadline")


def _because(reply: Message | None, default: str) -> str:
    found = getattr(reply, "reason", None)
    return str(found) if found else default


def _undo_op(undo: Undo) -> Op:
    return Op(
        "undo",
        "",
        undo.command,
        _classes(undo.expects, "Undo(expects=)"),
        _classes(undo.rejects, "Undo(rejects=)"),
        (),
        undo.timeout,
        undo.retry,
    )
