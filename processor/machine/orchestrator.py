"""A generic orchestrating saga: ordered steps, timeouts, retries, compensation, escalation.

Built only on the authoring API. The base class carries two deadline handlers (the step timer
and the saga deadline); a concrete saga adds an event handler per reply, usually with
:func:`on_reply`, and calls :meth:`OrchestratedSaga.begin` from its start handler. Every
decision is a pure function of the stored progress and the input, so replays are stable.

One step timer is enough because steps run one at a time: it is the reply timeout, the retry
backoff, or the window in which a late success is still awaited, and rescheduling it replaces
the previous one.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from processor.definition import saga_deadline_handler, saga_event_handler
from processor.handles import SagaCommands, SagaDeadlines, SagaLifecycle, SagaOutcome
from processor.machine.analysis import MachineSpec
from processor.machine.retry import RetryPolicy
from processor.machine.saga import MachineSaga, _saga_name
from processor.machine.states import ORCHESTRATED_TRANSITIONS, MachineState, Transitions
from processor.machine.steps import (
    DECISIONS,
    Attempt,
    CommandFactory,
    Decision,
    Escalation,
    Orchestration,
    Step,
    StepTimer,
    takes_attempt,
)
from processor.messages import Message

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

STEP_TIMER = "machine.step"
SAGA_DEADLINE = "machine.deadline"

ReplyKind = Literal["succeeded", "failed", "rejected", "unavailable", "undone", "undo-failed"]
ReplyHandler = Callable[..., None]
"""Type of the handlers :func:`on_reply` returns; annotate them ``ClassVar[ReplyHandler]``."""
_REPLY_OF = "__saga_reply_of__"
_UNDO_KINDS = ("undone", "undo-failed")
_S = MachineState


class Progress(BaseModel):
    """The orchestrator's durable bookkeeping.

    Attributes:
        key: Stable id of the instance (its saga id); seeds the retry jitter.
        step: The forward step in flight, or None.
        attempt: Attempt number of the step or undo in flight (1-based).
        deadline_at: The whole-saga deadline, if any.
        timeouts: Step timeouts overriding the declared ones (from settings at start).
        retries: Retry policies overriding the declared ones (from settings at start).
        late_windows: Late-success windows overriding the declared ones (idem).
        completed: Forward steps that succeeded, in order.
        undo_queue: Undos still to run; the head is in flight.
        undone: Undos that succeeded, in order.
        in_doubt: Steps whose outcome is unknown and whose late success must be undone.
        late: Late replies observed, as ``"step:ignored"`` or ``"step:undo"``, and decisions
            that came when nothing waited for one.
        state: The saga's own name for where it is (the running step's ``state_name``, with
            ``_ESCALATED`` while a person decides for it); None once no step runs.
        escalated: The step whose retries ran out and that now waits on a person's decision.
        escalated_in_doubt: Whether that step's last attempt timed out (its effect may land).
        skipped: Steps a person decided to skip; they have nothing to undo.
        breaker_waits: Times a participant answered that its breaker was open.
        cancelled: An operator cancelled the saga (its outcome is then CANCELLED).
        timed_out: The saga deadline passed (its outcome is then TIMED_OUT).
        reason: Why compensation started, or why the saga stopped.
    """

    model_config = ConfigDict(validate_assignment=True, extra="forbid")

    key: str = ""
    step: str | None = None
    attempt: int = 0
    deadline_at: datetime | None = None
    timeouts: dict[str, timedelta] = Field(default_factory=dict)
    retries: dict[str, RetryPolicy] = Field(default_factory=dict)
    late_windows: dict[str, timedelta] = Field(default_factory=dict)
    completed: list[str] = Field(default_factory=list)
    undo_queue: list[str] = Field(default_factory=list)
    undone: list[str] = Field(default_factory=list)
    in_doubt: list[str] = Field(default_factory=list)
    late: list[str] = Field(default_factory=list)
    state: str | None = None
    escalated: str | None = None
    escalated_in_doubt: bool = False
    skipped: list[str] = Field(default_factory=list)
    breaker_waits: int = 0
    cancelled: bool = False
    timed_out: bool = False
    reason: str | None = None


@dataclass(frozen=True)
class _Io:
    commands: SagaCommands
    deadlines: SagaDeadlines
    lifecycle: SagaLifecycle

    @property
    def now(self) -> datetime:
        return self.deadlines.now


class OrchestratedSaga(MachineSaga):
    """Base class of sagas declared as ordered steps.

    Subclasses set ``orchestration`` and decorate themselves with ``@saga``.
    """

    orchestration: ClassVar[Orchestration]
    machine_transitions: ClassVar[Transitions] = ORCHESTRATED_TRANSITIONS

    progress: Progress = Field(default_factory=Progress)

    # -- called by the concrete saga's handlers -------------------------------------------

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
    ) -> None:
        """Start the first step and arm the saga deadline.

        The overrides usually come from settings (``Annotated[RetryPolicy, Setting(...)]``
        parameters of the start handler); they are stored with the saga, so a change of
        settings applies to sagas started after it and a running saga keeps its schedule.

        Args:
            key: The saga id; retry jitter is derived from it.
            commands: The handler's commands handle.
            deadlines: The handler's deadlines handle.
            lifecycle: The handler's lifecycle handle.
            sla: Whole-saga budget overriding ``orchestration.sla`` (e.g. from a setting).
            timeouts: Step timeouts by step name overriding the declared ones.
            retries: Retry policies by step name overriding the declared ones; only for
                idempotent steps.
            late_windows: Late-success windows by step name overriding the declared ones.

        Raises:
            ValueError: An override names a step the orchestration does not declare, or gives
                retries to a step that is not idempotent.
        """
        io = _Io(commands, deadlines, lifecycle)
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
            deadlines.schedule(SAGA_DEADLINE, at=p.deadline_at)
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
        """
        io = _Io(commands, deadlines, lifecycle)
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
            if self.progress.undo_queue[:1] == [step] and self.machine_state == _S.COMPENSATING:
                io.deadlines.cancel(STEP_TIMER)
                self.progress.undo_queue = self.progress.undo_queue[1:]
                self.progress.undone = [*self.progress.undone, step]
                self._next_undo(io)
        elif self.progress.undo_queue[:1] == [step] and self.machine_state == _S.COMPENSATING:
            self._retry_undo(self.orchestration.step(step), io, f"undo of {step} failed: {reason}")

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
        io = _Io(commands, deadlines, lifecycle)
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
        elif p.undo_queue[:1] == [timer.step] and timer.attempt == p.attempt:
            if timer.purpose == "retry":
                self._send_undo(step, p.attempt + 1, io)
            else:
                self._retry_undo(step, io, f"undo of {step.name} timed out")

    @saga_deadline_handler(SAGA_DEADLINE)
    def on_saga_deadline(
        self, commands: SagaCommands, deadlines: SagaDeadlines, lifecycle: SagaLifecycle
    ) -> None:
        """The whole-saga budget is spent: record TIMED_OUT, then compensate or escalate."""
        io = _Io(commands, deadlines, lifecycle)
        if self.machine_state not in (_S.RUNNING, _S.WAITING):
            return  # compensation runs on its own budget
        p = self.progress
        if p.escalated is not None:
            if p.escalated_in_doubt:
                self._mark_in_doubt(self.orchestration.step(p.escalated))
            p.escalated = None
        elif p.step is not None:
            self._mark_in_doubt(self.orchestration.step(p.step))
        p.step = None
        p.timed_out = True
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
        io = _Io(commands, deadlines, lifecycle)
        if self.machine_state not in (_S.RUNNING, _S.WAITING):
            return
        p = self.progress
        if p.escalated is not None:
            if p.escalated_in_doubt:
                self._mark_in_doubt(self.orchestration.step(p.escalated))
            p.escalated = None
        elif p.step is not None:
            self._mark_in_doubt(self.orchestration.step(p.step))
        p.step = None
        p.cancelled = True
        self._compensate(io, f"cancelled by an operator: {reason}")

    # -- a person's decision -------------------------------------------------------------

    def waiting_on(self) -> str | None:
        """Why the saga waits on a person (its escalated step), for operators; else None."""
        p = self.progress
        if p.escalated is None:
            return None
        # The reason names the step already ("step ship timed out").
        return p.reason or f"step {p.escalated} escalated"

    def resolution_refusal(self, decision: str) -> str | None:
        """Why ``decision`` cannot apply now, or None when it can."""
        if decision not in DECISIONS:
            return f"decide one of {', '.join(DECISIONS)}, not {decision!r}"
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
        what was done. A decision that comes when no step waits for one (a duplicate, or one
        the saga deadline overtook) is recorded in ``progress.late`` and changes nothing.
        """
        io = _Io(commands, deadlines, lifecycle)
        p = self.progress
        if self.resolution_refusal(decision) is not None:
            p.late = [*p.late, f"decision:{decision}-ignored"]
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

    # -- forward -------------------------------------------------------------------------

    def _current_forward(self, name: str) -> Step | None:
        if self.machine_state in (_S.RUNNING, _S.WAITING) and self.progress.step == name:
            return self.orchestration.step(name)
        return None

    def _timeout(self, step: Step) -> timedelta:
        return self.progress.timeouts.get(step.name, step.timeout)

    def _retry(self, step: Step) -> RetryPolicy:
        return self.progress.retries.get(step.name, step.retry)

    def _late_window(self, step: Step) -> timedelta:
        return self.progress.late_windows.get(step.name, step.late_window)

    def _command(self, factory: CommandFactory, attempt: int, io: _Io) -> Message:
        if not takes_attempt(factory):
            return factory(self)  # type: ignore[call-arg]
        end = self.progress.deadline_at
        remaining = None if end is None else max(end - io.now, timedelta(0))
        return factory(self, Attempt(attempt, remaining))  # type: ignore[call-arg]

    def _start(self, index: int, io: _Io) -> None:
        p = self.progress
        step = self.orchestration.steps[index]
        if p.deadline_at is not None and p.deadline_at - io.now < step.min_budget:
            # Starting work that cannot finish in time only produces a late success to undo.
            left = max(p.deadline_at - io.now, timedelta(0))
            p.step = None
            self._compensate(io, f"step {step.name} not started: {left} left < {step.min_budget}")
            return
        target = _S.WAITING if step.waits_for_person else _S.RUNNING
        self.transition_to(target, io.now, f"step {step.name} started")
        p.state = step.state_name
        self._send_forward(step, 1, io)

    def _send_forward(self, step: Step, attempt: int, io: _Io) -> None:
        p = self.progress
        p.step = step.name
        p.attempt = attempt
        due = io.now + self._timeout(step)
        budget = p.deadline_at
        if step.waits_for_person and step.on_timeout == "escalate":
            # The person may still decide after the escalation, until the saga deadline.
            deadline = budget or due
        else:
            deadline = due if budget is None else min(due, budget)
        io.commands.send(self._command(step.action, attempt, io), deadline=deadline)
        timer = StepTimer(step=step.name, phase="forward", purpose="timeout", attempt=attempt)
        io.deadlines.schedule(STEP_TIMER, at=due, payload=timer)

    def _succeeded(self, step: Step, io: _Io) -> None:
        p = self.progress
        if self._current_forward(step.name) is None:
            self._late_success(step, io)
            return
        io.deadlines.cancel(STEP_TIMER)
        p.completed = [*p.completed, step.name]
        p.step = None
        p.escalated = None
        p.escalated_in_doubt = False
        index = self.orchestration.index(step.name) + 1
        if index < len(self.orchestration.steps):
            self._start(index, io)
            return
        self._complete(io, "every step succeeded")

    def _end(self, io: _Io) -> None:
        """End the saga with the outcome its path says (see ``SagaOutcome``)."""
        p = self.progress
        p.state = None
        state = self.machine_state
        if state == _S.COMPENSATION_FAILED:
            outcome = SagaOutcome.COMPENSATION_FAILED
        elif p.cancelled:
            outcome = SagaOutcome.CANCELLED
        elif p.timed_out:
            outcome = SagaOutcome.TIMED_OUT
        elif state == _S.COMPLETED:
            outcome = SagaOutcome.COMPLETED
        else:
            outcome = SagaOutcome.FAILED
        io.lifecycle.end(outcome)

    def _complete(self, io: _Io, why: str) -> None:
        self.transition_to(_S.COMPLETED, io.now, why)
        self._end(io)

    def _fail(self, io: _Io, why: str) -> None:
        """Stop without undoing anything (the ``fail`` policies)."""
        p = self.progress
        p.reason = why
        p.step = None
        io.deadlines.cancel(STEP_TIMER)
        io.deadlines.cancel(SAGA_DEADLINE)
        self.transition_to(_S.FAILED, io.now, why)
        self._end(io)

    def _retry_or_compensate(
        self, step: Step, io: _Io, why: str, *, retryable: bool = True, in_doubt: bool = False
    ) -> None:
        p = self.progress
        at = None
        policy = self._retry(step)
        if retryable and step.idempotent and policy.max_attempts > 1:
            at = policy.next_attempt_at(
                p.attempt,
                io.now,
                f"{p.key}:{step.name}",
                budget_end=p.deadline_at,
                min_budget=step.min_budget,
            )
        if at is not None:
            timer = StepTimer(step=step.name, phase="forward", purpose="retry", attempt=p.attempt)
            io.deadlines.schedule(STEP_TIMER, at=at, payload=timer)
            return
        if step.on_exhausted == "escalate":
            self._escalate_step(step, io, why, in_doubt=in_doubt)
            return
        if in_doubt:
            self._mark_in_doubt(step)
        p.step = None
        if step.on_exhausted == "fail":
            self._fail(io, why)
        else:
            self._compensate(io, why)

    def _escalate_step(self, step: Step, io: _Io, why: str, *, in_doubt: bool) -> None:
        """Hand the step to a person: WAITING, an escalation sent, a reminder timer armed."""
        p = self.progress
        p.escalated = step.name
        p.escalated_in_doubt = in_doubt
        p.reason = why
        p.state = f"{step.state_name}_ESCALATED"
        self.transition_to(_S.WAITING, io.now, f"step {step.name} escalated: {why}")
        self._escalate(io, "retries-exhausted", step, why)
        self._arm_reminder(step, io)

    def _remind(self, step: Step, io: _Io) -> None:
        self._escalate(io, "still-waiting", step, self.progress.reason or "")
        self._arm_reminder(step, io)

    def _arm_reminder(self, step: Step, io: _Io) -> None:
        timer = StepTimer(
            step=step.name, phase="forward", purpose="escalated", attempt=self.progress.attempt
        )
        io.deadlines.schedule(STEP_TIMER, at=io.now + step.escalation_timeout, payload=timer)

    def _mark_in_doubt(self, step: Step) -> None:
        if step.late_success == "undo" and step.name not in self.progress.in_doubt:
            self.progress.in_doubt = [*self.progress.in_doubt, step.name]

    def _late_refusal(self, step: str, kind: str, io: _Io) -> None:
        p = self.progress
        if step not in p.in_doubt:
            p.late = [*p.late, f"{step}:{kind}-ignored"]
            return
        # The participant says the step never took effect (e.g. it answered a command past its
        # budget without running it): nothing to undo, no need to wait out the late window.
        p.in_doubt = [n for n in p.in_doubt if n != step]
        p.late = [*p.late, f"{step}:{kind}-resolved"]
        if self.machine_state == _S.COMPENSATING and not p.undo_queue:
            io.deadlines.cancel(STEP_TIMER)
            self._next_undo(io)

    def _late_success(self, step: Step, io: _Io) -> None:
        p = self.progress
        if step.name in p.completed:
            return  # a duplicate of a success already applied
        if step.name not in p.in_doubt:
            p.late = [*p.late, f"{step.name}:ignored"]
            return
        # The effect landed after all: undo it before the earlier steps it came after.
        p.in_doubt = [n for n in p.in_doubt if n != step.name]
        p.late = [*p.late, f"{step.name}:undo"]
        p.completed = [*p.completed, step.name]
        if p.undo_queue and self.machine_state == _S.COMPENSATING:
            p.undo_queue = [p.undo_queue[0], step.name, *p.undo_queue[1:]]
        else:
            p.undo_queue = [step.name]
            self._send_undo(step, 1, io)

    # -- compensation --------------------------------------------------------------------

    def _compensate(self, io: _Io, why: str) -> None:
        p = self.progress
        p.reason = why
        p.state = None
        io.deadlines.cancel(STEP_TIMER)
        steps = self.orchestration
        p.undo_queue = [n for n in reversed(p.completed) if steps.step(n).compensation]
        if not p.undo_queue and not p.in_doubt:
            self.transition_to(_S.FAILED, io.now, why)
            self._end(io)
            return
        self.transition_to(_S.COMPENSATING, io.now, why)
        self._next_undo(io)

    def _next_undo(self, io: _Io) -> None:
        p = self.progress
        if p.undo_queue:
            self._send_undo(self.orchestration.step(p.undo_queue[0]), 1, io)
        elif p.in_doubt:
            steps = [self.orchestration.step(n) for n in p.in_doubt]
            window = max(self._late_window(s) for s in steps)
            timer = StepTimer(step=steps[0].name, phase="undo", purpose="late", attempt=0)
            io.deadlines.schedule(STEP_TIMER, at=io.now + window, payload=timer)
        else:
            self.transition_to(_S.FAILED, io.now, "compensation finished")
            self._end(io)

    def _send_undo(self, step: Step, attempt: int, io: _Io) -> None:
        assert step.compensation is not None
        self.progress.attempt = attempt
        due = io.now + (step.undo_timeout or step.timeout)
        io.commands.send(self._command(step.compensation, attempt, io), deadline=due)
        timer = StepTimer(step=step.name, phase="undo", purpose="timeout", attempt=attempt)
        io.deadlines.schedule(STEP_TIMER, at=due, payload=timer)

    def _retry_undo(self, step: Step, io: _Io, why: str) -> None:
        p = self.progress
        # Undos are not capped by the saga deadline: it may be long gone, and money or stock
        # is stuck until they finish. Their own policy bounds them instead.
        at = step.undo_retry.next_attempt_at(p.attempt, io.now, f"{p.key}:{step.name}:undo")
        if at is not None:
            timer = StepTimer(step=step.name, phase="undo", purpose="retry", attempt=p.attempt)
            io.deadlines.schedule(STEP_TIMER, at=at, payload=timer)
            return
        p.reason = why
        self.transition_to(_S.COMPENSATION_FAILED, io.now, why)
        self._escalate(io, "compensation-failed", step, why)
        self._end(io)

    def _escalate(self, io: _Io, reason: str, step: Step | None, detail: str) -> None:
        escalation = Escalation(
            reason=reason,
            step=step.name if step else None,
            machine_state=str(self.machine_state),
            detail=detail,
        )
        io.commands.send(self.orchestration.escalation(self, escalation))

    # -- wiring --------------------------------------------------------------------------

    @classmethod
    def _replies(cls) -> Iterator[tuple[str, str, ReplyKind]]:
        """``(handler name, step, kind)`` of every :func:`on_reply` handler of the class."""
        for klass in cls.__mro__:
            for name, attr in vars(klass).items():
                found = getattr(attr, _REPLY_OF, None)
                if found is not None:
                    yield name, found[0], found[1]

    @classmethod
    def definition_problems(cls) -> list[str]:
        """Reply handlers must name declared steps; undo replies need a step with an undo."""
        o = getattr(cls, "orchestration", None)
        if not isinstance(o, Orchestration):
            return [f"set orchestration = Orchestration(steps=...) on {cls.__qualname__}"]
        steps = {s.name: s for s in o.steps}
        problems = []
        for handler, name, kind in cls._replies():
            step = steps.get(name)
            if step is None:
                close = difflib.get_close_matches(name, steps, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                problems.append(
                    f"reply handler {handler} names step {name!r}, which the orchestration "
                    f"does not declare (its steps: {', '.join(steps)}){hint}"
                )
            elif kind in _UNDO_KINDS and step.compensation is None:
                problems.append(
                    f"reply handler {handler} reports the undo ({kind}) of step {name!r}, "
                    "which declares no compensation"
                )
        return problems

    @classmethod
    def wiring_warnings(cls) -> list[str]:
        """What ``lint-saga`` warns of: steps only a timeout can move past.

        Not import errors: a handler written by hand may call :meth:`reply` itself.
        """
        kinds: dict[str, set[str]] = {}
        for _, name, kind in cls._replies():
            kinds.setdefault(name, set()).add(kind)
        warnings = []
        for step in cls.orchestration.steps:
            seen = kinds.get(step.name, set())
            if "succeeded" not in seen:
                warnings.append(
                    f"step {step.name!r} has no on_reply(..., kind='succeeded') handler: only "
                    "its timeout moves the saga on, so every run fails there"
                )
            if step.compensation is not None and "undone" not in seen:
                warnings.append(
                    f"step {step.name!r} has a compensation but no on_reply(..., kind='undone') "
                    "handler: every undo waits for its timeout and ends COMPENSATION_FAILED"
                )
        return warnings

    # -- analysis ------------------------------------------------------------------------

    @classmethod
    def machine_spec(cls) -> MachineSpec:
        """Describe the machine the orchestration actually uses."""
        o = cls.orchestration
        used = {_S.NEW, _S.COMPENSATING, _S.COMPLETED, _S.FAILED, _S.COMPENSATION_FAILED}
        if any(not s.waits_for_person for s in o.steps):
            used.add(_S.RUNNING)
        escalating = [s.name for s in o.steps if s.on_exhausted == "escalate"]
        if o.has_waiting or escalating:
            used.add(_S.WAITING)
        if o.sla is not None:
            used.add(_S.TIMED_OUT)
        edges = {
            src: [t for t in cls.machine_transitions.targets(src) if t in used] for src in used
        }
        saga_timer = {SAGA_DEADLINE} if o.sla is not None else set()
        timers = {
            _S.RUNNING: frozenset({STEP_TIMER, *saga_timer}),
            _S.WAITING: frozenset({STEP_TIMER, *saga_timer}),
            _S.COMPENSATING: frozenset({STEP_TIMER}),
        }
        ending = {_S.COMPLETED, _S.FAILED, _S.COMPENSATION_FAILED}
        if o.on_saga_timeout == "escalate":
            ending.add(_S.TIMED_OUT)

        def listing(label: str, names: list[str]) -> str:
            return f"{label} {', '.join(names)}" if names else ""

        waits = [s.name for s in o.steps if s.waits_for_person]
        notes = {
            _S.RUNNING: listing("steps", [s.name for s in o.steps if not s.waits_for_person]),
            _S.WAITING: "; ".join(
                part
                for part in (listing("waits for", waits), listing("escalates", escalating))
                if part
            ),
            _S.COMPENSATING: listing("undo", [s.name for s in o.steps if s.compensation]),
        }
        return MachineSpec(
            name=_saga_name(cls),
            transitions=Transitions.of(edges, initial=cls.machine_transitions.initial),
            timers={s: t for s, t in timers.items() if s in used},
            ending=frozenset(ending),
            notes={s: n for s, n in notes.items() if s in used and n},
            wiring=tuple(cls.wiring_warnings()),
            substates={
                state: names
                for state, names in (
                    (_S.RUNNING, tuple(s.state_name for s in o.steps if not s.waits_for_person)),
                    (
                        _S.WAITING,
                        tuple(s.state_name for s in o.steps if s.waits_for_person)
                        + tuple(
                            f"{s.state_name}_ESCALATED"
                            for s in o.steps
                            if s.on_exhausted == "escalate"
                        ),
                    ),
                )
                if names and state in used
            },
        )


def on_reply(
    event_type: type[Message],
    *,
    step: str,
    kind: ReplyKind = "succeeded",
    association_property: str,
    reason_field: str | None = "reason",
) -> ReplyHandler:
    """Declare, in a saga class body, the handler of a participant's reply.

    Example:
        ``on_reserved: ClassVar[ReplyHandler] = on_reply(StockReserved, step="reserve",
        association_property="order_id")``

    Args:
        event_type: The reply event class.
        step: Step the reply is about.
        kind: What the reply means (see :meth:`OrchestratedSaga.reply`).
        association_property: Field of the event holding the saga id.
        reason_field: Field of the event holding a failure reason, if any.

    Returns:
        A handler function, marked like one written with ``@saga_event_handler``.
    """

    def handler(
        self: OrchestratedSaga,
        event: Any,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
    ) -> None:
        reason = getattr(event, reason_field, None) if reason_field else None
        self.reply(step, kind, commands, deadlines, lifecycle, reason=reason)

    setattr(handler, _REPLY_OF, (step, kind))
    return _event_handler(handler, event_type, association_property)


def on_decision(
    event_type: type[Message],
    *,
    association_property: str,
    decision_field: str = "decision",
    reason_field: str | None = "reason",
) -> ReplyHandler:
    """Declare the handler of an event that carries a person's decision on an escalated step.

    The event's ``decision_field`` holds ``"retry"``, ``"skip"`` or ``"compensate"`` (see
    :meth:`OrchestratedSaga.resolve`); an operator can decide the same with ``saga resolve``.

    Args:
        event_type: The decision event class.
        association_property: Field of the event holding the saga id.
        decision_field: Field of the event holding the decision.
        reason_field: Field of the event holding why, if any.

    Returns:
        A handler function, marked like one written with ``@saga_event_handler``.
    """

    def handler(
        self: OrchestratedSaga,
        event: Any,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
    ) -> None:
        decision = str(getattr(event, decision_field))
        reason = getattr(event, reason_field, None) if reason_field else None
        self.resolve(decision, commands, deadlines, lifecycle, reason=reason)  # type: ignore[arg-type]

    return _event_handler(handler, event_type, association_property)


def _event_handler(
    handler: Callable[..., None], event_type: type[Message], association_property: str
) -> ReplyHandler:
    """``handler`` named, annotated and marked as ``@saga_event_handler`` would leave it."""
    # The handler name keys the runtime's parameter table, so it must be unique per saga; the
    # event type is (one handler per event type).
    handler.__name__ = f"on_{event_type.__name__}"
    handler.__qualname__ = handler.__name__
    handler.__annotations__ = {
        "event": event_type,
        "commands": SagaCommands,
        "deadlines": SagaDeadlines,
        "lifecycle": SagaLifecycle,
        "return": None,
    }
    marked: Callable[..., None] = saga_event_handler(
        event_type, association_property=association_property
    )(handler)
    return marked
