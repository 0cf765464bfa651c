"""A generic orchestrating saga: ordered steps, timeouts, retries, compensation, escalation.

Built only on the authoring API. The base class carries two deadline handlers (the step timer
and the saga deadline); a concrete saga adds an event handler per reply, usually with
:func:`on_reply`, and calls :meth:`OrchestratedSaga.begin` from its start handler. Every
decision is a pure function of the stored progress and the input, so replays are stable.

One step timer is enough because steps run one at a time: it is the reply timeout, the retry
backoff, or the window in which a late success is still awaited, and rescheduling it replaces
the previous one.

This module holds the entry points; the mechanics they drive are in
:mod:`processor._authoring.orchestration.stepping`, the reply-handler declarations in
:mod:`processor._authoring.orchestration.replies`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, overload

from processor._authoring.choices import choice_problem
from processor._authoring.definition import saga_deadline_handler
from processor._authoring.handles import SagaCommands, SagaDeadlines, SagaLifecycle
from processor._authoring.messages import Message
from processor._authoring.orchestration.analysis import MachineSpec
from processor._authoring.orchestration.generated import declaration_problems, install, keep_start
from processor._authoring.orchestration.progress import (
    SAGA_DEADLINE,
    STEP_TIMER,
    HandlerIo,
    Progress,
    ReplyHandler,
    ReplyKind,
)
from processor._authoring.orchestration.replies import (
    on_decision,
    on_reply,
    reply_problems,
    wiring_warnings,
)
from processor._authoring.orchestration.retry import RetryPolicy
from processor._authoring.orchestration.spec import orchestration_spec
from processor._authoring.orchestration.states import MachineState
from processor._authoring.orchestration.stepping import StepMachine
from processor._authoring.orchestration.steps import DECISIONS, Decision, StepTimer

__all__ = [
    "SAGA_DEADLINE",
    "STEP_TIMER",
    "OrchestratedSaga",
    "Progress",
    "ReplyHandler",
    "ReplyKind",
    "on_decision",
    "on_reply",
]

_S = MachineState


class OrchestratedSaga(StepMachine):
    """Base class of sagas declared as ordered steps.

    Subclasses set ``orchestration`` and decorate themselves with ``@saga``. The handlers the
    orchestration declares (``Step(..., replies=...)``, ``Orchestration(start=...)``) are
    generated as the class is created.
    """

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        install(cls)

    # -- called by the concrete saga's handlers -------------------------------------------

    @overload
    def begin(
        self,
        key: Message,
        commands: HandlerIo,
        /,
        *,
        sla: timedelta | None = None,
        timeouts: Mapping[str, timedelta] | None = None,
        retries: Mapping[str, RetryPolicy] | None = None,
        late_windows: Mapping[str, timedelta] | None = None,
    ) -> None: ...
    @overload
    def begin(
        self,
        key: str,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        *,
        sla: timedelta | None = None,
        timeouts: Mapping[str, timedelta] | None = None,
        retries: Mapping[str, RetryPolicy] | None = None,
        late_windows: Mapping[str, timedelta] | None = None,
    ) -> None: ...
    def begin(
        self,
        key: str | Message,
        commands: SagaCommands | HandlerIo,
        deadlines: SagaDeadlines | None = None,
        lifecycle: SagaLifecycle | None = None,
        *,
        sla: timedelta | None = None,
        timeouts: Mapping[str, timedelta] | None = None,
        retries: Mapping[str, RetryPolicy] | None = None,
        late_windows: Mapping[str, timedelta] | None = None,
    ) -> None:
        """Start the first step and arm the saga deadline.

        Called as ``begin(event, io)`` from a start handler that asks for ``io: HandlerIo``:
        the event is kept on the state (see ``Orchestration.start``) and its association
        value is the saga id. The older ``begin(saga_id, commands, deadlines, lifecycle)``
        keeps nothing.

        The overrides usually come from settings (``Annotated[RetryPolicy, Setting(...)]``
        parameters of the start handler, or ``Orchestration(settings=...)``); they are stored
        with the saga, so a change of settings applies to sagas started after it and a
        running saga keeps its schedule.

        Args:
            key: The start event, or the saga id; retry jitter is derived from the saga id.
            commands: The handler's :class:`HandlerIo` (with an event), or its commands handle.
            deadlines: The handler's deadlines handle (with a saga id).
            lifecycle: The handler's lifecycle handle (with a saga id).
            sla: Whole-saga budget overriding ``orchestration.sla`` (e.g. from a setting).
            timeouts: Step timeouts by step name overriding the declared ones.
            retries: Retry policies by step name overriding the declared ones; only for
                idempotent steps.
            late_windows: Late-success windows by step name overriding the declared ones.

        Raises:
            ValueError: An override names a step the orchestration does not declare, or gives
                retries to a step that is not idempotent.
        """
        if isinstance(commands, HandlerIo):
            io = commands
        else:
            assert deadlines is not None, "begin(saga_id, commands, deadlines, lifecycle)"
            assert lifecycle is not None, "begin(saga_id, commands, deadlines, lifecycle)"
            io = HandlerIo(commands, deadlines, lifecycle)
        if isinstance(key, Message):
            key = keep_start(self, key)
        p = self.progress
        p.key = key
        names = {s.name for s in self.orchestration.steps}
        for what, given in (
            ("timeouts", timeouts),
            ("retries", retries),
            ("late_windows", late_windows),
        ):
            unknown = sorted(set(given or {}) - names)
            if unknown:
                raise ValueError(f"{what} for unknown steps {unknown}")
        unsafe = sorted(
            n
            for n, policy in (retries or {}).items()
            if policy.max_attempts > 1 and not self.orchestration.step(n).idempotent
        )
        if unsafe:
            raise ValueError(f"retries for steps that are not idempotent: {unsafe}")
        p.timeouts = dict(timeouts or {})
        p.retries = dict(retries or {})
        p.late_windows = dict(late_windows or {})
        budget = sla if sla is not None else self.orchestration.sla
        if budget is not None:
            p.deadline_at = io.now + budget
            io.deadlines.schedule(SAGA_DEADLINE, at=p.deadline_at)
        self._start(0, io)

    def reply(
        self,
        step: str,
        kind: ReplyKind,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        *,
        reason: str | None = None,
    ) -> None:
        """Apply a participant's reply about ``step``.

        Args:
            step: Step name.
            kind: ``"succeeded"``; ``"failed"`` (may be retried); ``"rejected"`` (a business
                refusal, never retried); ``"unavailable"`` (the participant's breaker is open:
                the same attempt is sent again after the step's ``breaker_wait``, spending no
                retry); ``"undone"`` or ``"undo-failed"`` for the undo.
            commands: The handler's commands handle.
            deadlines: The handler's deadlines handle.
            lifecycle: The handler's lifecycle handle.
            reason: The participant's reason, for the record.

        Raises:
            ValueError: ``kind`` is not a :data:`ReplyKind`. A hand-written handler passed it;
                the saga is parked rather than the reply read as some other kind.
        """
        wrong = choice_problem("kind", kind, ReplyKind)
        if wrong is not None:
            raise ValueError(f"reply about step {step!r}: {wrong}")
        io = HandlerIo(commands, deadlines, lifecycle)
        if kind == "succeeded":
            self._succeeded(self.orchestration.step(step), io)
        elif kind == "unavailable":
            current = self._current_forward(step)
            if current is None or self.progress.escalated == step:
                self.progress.late = [*self.progress.late, f"{step}:unavailable-ignored"]
                return
            # Not an attempt that failed: the command never ran. Wait, then send it again.
            p = self.progress
            p.breaker_waits += 1
            timer = StepTimer(step=step, phase="forward", purpose="resume", attempt=p.attempt)
            io.deadlines.schedule(STEP_TIMER, at=io.now + current.breaker_wait, payload=timer)
        elif kind in ("failed", "rejected"):
            current = self._current_forward(step)
            if current is None:
                self._late_refusal(step, kind, io)
                return
            if self.progress.escalated == step:
                # A person decides this step now; a straggling refusal changes nothing.
                self.progress.late = [*self.progress.late, f"{step}:{kind}-while-escalated"]
                return
            why = f"step {step} {kind}" + (f": {reason}" if reason else "")
            self._retry_or_compensate(current, io, why, retryable=kind == "failed")
        elif kind == "undone":
            self._undone(step, io)
        else:
            self._undo_failed(step, io, reason)

    # -- deadlines ---------------------------------------------------------------------------

    @saga_deadline_handler(STEP_TIMER)
    def on_step_timer(
        self,
        timer: StepTimer,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
    ) -> None:
        """A step's reply timeout, retry backoff or late-success window ran out."""
        io = HandlerIo(commands, deadlines, lifecycle)
        p = self.progress
        step = self.orchestration.step(timer.step)
        if timer.phase == "forward":
            if self._current_forward(timer.step) is None or timer.attempt != p.attempt:
                return
            if timer.purpose == "escalated":
                if p.escalated == step.name:
                    self._remind(step, io)
            elif timer.purpose == "resume":
                self._send_forward(step, p.attempt, io)
            elif timer.purpose == "retry":
                self._send_forward(step, p.attempt + 1, io)
            elif step.waits_for_person and step.on_timeout == "escalate":
                # Keep waiting for the person; the saga deadline still bounds the wait.
                self._escalate(io, "approval-timeout", step, f"no decision on {step.name}")
            else:
                self._retry_or_compensate(step, io, f"step {step.name} timed out", in_doubt=True)
        elif timer.purpose == "late":
            # Nobody reported a late success in time: treat the in-doubt steps as not landed.
            p.in_doubt = []
            self._next_undo(io)
        else:
            self._undo_timer(timer, io)

    @saga_deadline_handler(SAGA_DEADLINE)
    def on_saga_deadline(
        self, commands: SagaCommands, deadlines: SagaDeadlines, lifecycle: SagaLifecycle
    ) -> None:
        """The whole-saga budget is spent: record TIMED_OUT, then compensate or escalate."""
        io = HandlerIo(commands, deadlines, lifecycle)
        if not self._moving_forward():
            return  # compensation runs on its own budget (also while a person decides an undo)
        self._abandon_step()
        self.progress.timed_out = True
        self.transition_to(_S.TIMED_OUT, io.now, "saga deadline passed")
        io.deadlines.cancel(STEP_TIMER)
        policy = self.orchestration.on_saga_timeout
        if policy == "escalate":
            self._escalate(io, "saga-timeout", None, "saga deadline passed")
            self._end(io)
        elif policy == "fail":
            self._fail(io, "saga deadline passed")
        else:
            self._compensate(io, "saga deadline passed")

    def operator_cancel(
        self,
        reason: str,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
    ) -> None:
        """An operator cancelled the saga: undo what was done, as a failed step would.

        A step in flight is in doubt (its command may have been carried out), so a late success
        is still undone. A saga already compensating or finished is left as it is.
        """
        io = HandlerIo(commands, deadlines, lifecycle)
        if not self._moving_forward():
            return
        self._abandon_step()
        self.progress.cancelled = True
        self._compensate(io, f"cancelled by an operator: {reason}")

    # -- a person's decision -------------------------------------------------------------

    def waiting_on(self) -> str | None:
        """Why the saga waits on a person (its escalated step or undo), for operators; else None."""
        p = self.progress
        if p.undo_escalated is not None:
            return p.undo_failure or f"undo of step {p.undo_escalated} escalated"
        if p.escalated is None:
            return None
        # The reason names the step already ("step ship timed out").
        return p.reason or f"step {p.escalated} escalated"

    def waiting_kind(self) -> str | None:
        """``"undo"`` while a failed undo waits on a person, ``"step"`` while a step does."""
        p = self.progress
        if p.undo_escalated is not None:
            return "undo"
        return "step" if p.escalated is not None else None

    def resolution_refusal(self, decision: str) -> str | None:
        """Why ``decision`` cannot apply now, or None when it can."""
        wrong = choice_problem("decision", decision, Decision)
        if wrong is not None:
            return wrong
        if self.progress.undo_escalated is not None and self.machine_state == _S.WAITING:
            return self._undo_refusal(decision)
        if self.progress.escalated is None or self.machine_state != _S.WAITING:
            return "no step of this saga waits on a person's decision"
        return None

    def resolve(
        self,
        decision: Decision,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        *,
        reason: str | None = None,
    ) -> None:
        """Apply a person's decision about the escalated step.

        ``"retry"`` starts the step again with a fresh retry schedule; ``"skip"`` moves on to
        the next step as if it had succeeded (nothing to undo for it); ``"compensate"`` undoes
        what was done. For an undo that ran out of retries, ``"retry"`` sends the undo again
        with a fresh ``undo_retry`` schedule, ``"skip"`` takes it as done by hand and goes on
        undoing the earlier steps, and ``"compensate"`` is refused (see ``_resolve_undo``).
        A decision that comes when no step waits for one (a duplicate, or one the saga deadline
        overtook) is recorded in ``progress.late`` and changes nothing.
        """
        io = HandlerIo(commands, deadlines, lifecycle)
        p = self.progress
        if self.resolution_refusal(decision) is not None:
            p.late = [*p.late, f"decision:{decision}-ignored"]
            return
        if p.undo_escalated is not None:
            said = f"{decision} decided" + (f": {reason}" if reason else "")
            self._resolve_undo(decision, io, said)
            return
        assert p.escalated is not None
        step = self.orchestration.step(p.escalated)
        in_doubt = p.escalated_in_doubt
        p.escalated = None
        p.escalated_in_doubt = False
        io.deadlines.cancel(STEP_TIMER)
        said = f"{decision} decided" + (f": {reason}" if reason else "")
        index = self.orchestration.index(step.name)
        if decision == "retry":
            p.step = None
            p.reason = None
            self._start(index, io)
        elif decision == "skip":
            p.step = None
            p.reason = None
            p.skipped = [*p.skipped, step.name]
            if index + 1 < len(self.orchestration.steps):
                self._start(index + 1, io)
            else:
                self._complete(io, f"step {step.name} skipped: {said}")
        else:
            if in_doubt:
                self._mark_in_doubt(step)
            p.step = None
            self._compensate(io, f"step {step.name}: {said}")

    def operator_resolve(
        self,
        decision: str,
        reason: str,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
    ) -> None:
        """An operator decided for the escalated step (``saga resolve``); see :meth:`resolve`."""
        if decision in DECISIONS:
            self.resolve(decision, commands, deadlines, lifecycle, reason=reason)

    # -- wiring and analysis -------------------------------------------------------------

    @classmethod
    def definition_problems(cls) -> list[str]:
        """Reply handlers must name declared steps; undo replies need a step with an undo.

        A reply or start event is declared once, beside its step or as a handler.
        """
        return [*reply_problems(cls), *declaration_problems(cls)]

    @classmethod
    def wiring_warnings(cls) -> list[str]:
        """What ``lint-saga`` warns of: steps only a timeout can move past.

        Not import errors: a handler written by hand may call :meth:`reply` itself.
        """
        return wiring_warnings(cls)

    @classmethod
    def machine_spec(cls) -> MachineSpec:
        """Describe the machine the orchestration actually uses."""
        return orchestration_spec(cls)
