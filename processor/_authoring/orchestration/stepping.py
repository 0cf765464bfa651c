"""How an orchestrated saga moves: sending steps and undos, retrying, compensating, escalating.

:class:`StepMachine` holds the orchestrator's mechanics; ``OrchestratedSaga`` adds the entry
points (start, replies, timers, decisions) that call into them. Every method here reads and
writes only the stored :class:`Progress` and the handles it is given, so a replayed input takes
the same path.
"""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar, Literal

from pydantic import Field

from processor._authoring.handles import SagaOutcome
from processor._authoring.messages import Message
from processor._authoring.orchestration.progress import (
    SAGA_DEADLINE,
    STEP_TIMER,
    HandlerIo,
    Progress,
)
from processor._authoring.orchestration.retry import RetryPolicy
from processor._authoring.orchestration.saga import MachineSaga
from processor._authoring.orchestration.states import (
    ORCHESTRATED_TRANSITIONS,
    MachineState,
    Transitions,
)
from processor._authoring.orchestration.steps import (
    Attempt,
    CommandFactory,
    Escalation,
    Orchestration,
    Step,
    StepTimer,
    takes_attempt,
)

__all__ = ["StepMachine"]

_S = MachineState

# Which way a step runs: its action, or its undo (see ``StepTimer.phase``).
Phase = Literal["forward", "undo"]


class StepMachine(MachineSaga):
    """The orchestrator's mechanics, shared by every saga declared as ordered steps."""

    orchestration: ClassVar[Orchestration]
    machine_transitions: ClassVar[Transitions] = ORCHESTRATED_TRANSITIONS

    progress: Progress = Field(default_factory=Progress)

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

    def _command(self, factory: CommandFactory, attempt: int, io: HandlerIo) -> Message:
        if not takes_attempt(factory):
            return factory(self)  # type: ignore[call-arg]
        end = self.progress.deadline_at
        remaining = None if end is None else max(end - io.now, timedelta(0))
        return factory(self, Attempt(attempt, remaining))  # type: ignore[call-arg]

    def _start(self, index: int, io: HandlerIo) -> None:
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

    def _send_forward(self, step: Step, attempt: int, io: HandlerIo) -> None:
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

    def _succeeded(self, step: Step, io: HandlerIo) -> None:
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

    def _end(self, io: HandlerIo) -> None:
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
        elif state == _S.COMPENSATED:
            outcome = SagaOutcome.COMPENSATED
        else:
            outcome = SagaOutcome.FAILED
        io.lifecycle.end(outcome)

    def _complete(self, io: HandlerIo, why: str) -> None:
        self.transition_to(_S.COMPLETED, io.now, why)
        self._end(io)

    def _fail(self, io: HandlerIo, why: str) -> None:
        """Stop without undoing anything (the ``fail`` policies)."""
        p = self.progress
        p.reason = why
        p.step = None
        io.deadlines.cancel(STEP_TIMER)
        io.deadlines.cancel(SAGA_DEADLINE)
        self.transition_to(_S.FAILED, io.now, why)
        self._end(io)

    def _retry_or_compensate(
        self, step: Step, io: HandlerIo, why: str, *, retryable: bool = True, in_doubt: bool = False
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
            p.reason = why  # the last failure, for `show` and the console
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

    def _escalate_step(self, step: Step, io: HandlerIo, why: str, *, in_doubt: bool) -> None:
        """Hand the step to a person: WAITING, an escalation sent, a reminder timer armed."""
        p = self.progress
        p.escalated = step.name
        p.escalated_in_doubt = in_doubt
        p.reason = why
        self._wait_on_person(step, io, why, "forward")

    def _wait_on_person(self, step: Step, io: HandlerIo, why: str, phase: Phase) -> None:
        """WAITING on a person about ``step`` or its undo: an escalation sent, a reminder armed."""
        if phase == "undo":
            what, suffix, reason = f"undo of {step.name}", "_UNDO_ESCALATED", "compensation-failed"
        else:
            what, suffix, reason = f"step {step.name}", "_ESCALATED", "retries-exhausted"
        self.progress.state = f"{step.state_name}{suffix}"
        self.transition_to(_S.WAITING, io.now, f"{what} escalated: {why}")
        self._escalate(io, reason, step, why)
        self._arm_reminder(step, io, phase)

    def _remind(self, step: Step, io: HandlerIo) -> None:
        self._escalate(io, "still-waiting", step, self.progress.reason or "")
        self._arm_reminder(step, io, "forward")

    def _arm_reminder(self, step: Step, io: HandlerIo, phase: Phase) -> None:
        timer = StepTimer(
            step=step.name, phase=phase, purpose="escalated", attempt=self.progress.attempt
        )
        io.deadlines.schedule(STEP_TIMER, at=io.now + step.escalation_timeout, payload=timer)

    def _mark_in_doubt(self, step: Step) -> None:
        if step.late_success == "undo" and step.name not in self.progress.in_doubt:
            self.progress.in_doubt = [*self.progress.in_doubt, step.name]

    def _abandon_step(self) -> None:
        """Stop waiting on the step in flight or escalated; one that may have landed is in doubt."""
        p = self.progress
        if p.escalated is not None:
            if p.escalated_in_doubt:
                self._mark_in_doubt(self.orchestration.step(p.escalated))
            p.escalated = None
        elif p.step is not None:
            self._mark_in_doubt(self.orchestration.step(p.step))
        p.step = None

    def _late_refusal(self, step: str, kind: str, io: HandlerIo) -> None:
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

    def _late_success(self, step: Step, io: HandlerIo) -> None:
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
        if p.undo_queue:
            # Compensating, or waiting on a person about the undo at the head of the queue.
            p.undo_queue = [p.undo_queue[0], step.name, *p.undo_queue[1:]]
        else:
            p.undo_queue = [step.name]
            self._send_undo(step, 1, io)

    # -- compensation --------------------------------------------------------------------

    def _compensate(self, io: HandlerIo, why: str) -> None:
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

    def _next_undo(self, io: HandlerIo) -> None:
        p = self.progress
        if p.undo_queue:
            self._send_undo(self.orchestration.step(p.undo_queue[0]), 1, io)
        elif p.in_doubt:
            p.state = None
            steps = [self.orchestration.step(n) for n in p.in_doubt]
            window = max(self._late_window(s) for s in steps)
            timer = StepTimer(step=steps[0].name, phase="undo", purpose="late", attempt=0)
            io.deadlines.schedule(STEP_TIMER, at=io.now + window, payload=timer)
        else:
            # COMPENSATED once an undo ran; FAILED when the only steps left were in doubt and
            # none of them turned out to have landed (nothing was undone).
            p.state = None
            target = _S.COMPENSATED if p.undone else _S.FAILED
            self.transition_to(target, io.now, "compensation finished")
            self._end(io)

    def _send_undo(self, step: Step, attempt: int, io: HandlerIo) -> None:
        assert step.compensation is not None
        self.progress.state = f"{step.state_name}_UNDO"
        self.progress.attempt = attempt
        due = io.now + (step.undo_timeout or step.timeout)
        io.commands.send(self._command(step.compensation, attempt, io), deadline=due)
        timer = StepTimer(step=step.name, phase="undo", purpose="timeout", attempt=attempt)
        io.deadlines.schedule(STEP_TIMER, at=due, payload=timer)

    def _retry_undo(self, step: Step, io: HandlerIo, why: str) -> None:
        p = self.progress
        # Undos are not capped by the saga deadline: it may be long gone, and money or stock
        # is stuck until they finish. Their own policy bounds them instead.
        at = step.undo_retry.next_attempt_at(p.attempt, io.now, f"{p.key}:{step.name}:undo")
        if at is not None:
            timer = StepTimer(step=step.name, phase="undo", purpose="retry", attempt=p.attempt)
            io.deadlines.schedule(STEP_TIMER, at=at, payload=timer)
            return
        self._escalate_undo(step, io, why)

    # -- an undo a person decides ------------------------------------------------------------

    def _compensating(self) -> bool:
        """Whether compensation runs (not paused on a person)."""
        return self.machine_state == _S.COMPENSATING and self.progress.undo_escalated is None

    def _moving_forward(self) -> bool:
        """Whether forward steps run or wait (what the saga deadline and a cancel stop)."""
        return (
            self.machine_state in (_S.RUNNING, _S.WAITING) and self.progress.undo_escalated is None
        )

    def _escalate_undo(self, step: Step, io: HandlerIo, why: str) -> None:
        """Hand a failed undo to a person: WAITING, compensation paused, a reminder armed.

        The undo stays at the head of the queue; ``saga resolve ... retry`` sends it again and
        ``skip`` takes it as done by hand (see :meth:`_resolve_undo`).
        """
        p = self.progress
        p.undo_escalated = step.name
        p.undo_failure = why
        self._wait_on_person(step, io, why, "undo")

    def _undo_timer(self, timer: StepTimer, io: HandlerIo) -> None:
        """The undo's reply timeout, retry backoff or (while a person decides) reminder."""
        p = self.progress
        step = self.orchestration.step(timer.step)
        if p.undo_queue[:1] != [timer.step] or timer.attempt != p.attempt:
            return
        if p.undo_escalated is not None:
            if timer.purpose == "escalated" and p.undo_escalated == step.name:
                self._escalate(io, "still-waiting", step, p.undo_failure or "")
                self._arm_reminder(step, io, "undo")
        elif timer.purpose == "retry":
            self._send_undo(step, p.attempt + 1, io)
        elif timer.purpose == "timeout":
            self._retry_undo(step, io, f"undo of {step.name} timed out")

    def _undone(self, name: str, io: HandlerIo) -> None:
        """A participant says the undo of step ``name`` is done."""
        p = self.progress
        if p.undo_queue[:1] != [name]:
            return
        if p.undo_escalated == name:
            # The undo landed after all while a person was asked about it: nothing to decide.
            p.late = [*p.late, f"{name}:undone-while-escalated"]
            self._resume_compensation(io, f"undo of {name} reported done")
        elif not self._compensating():
            return
        io.deadlines.cancel(STEP_TIMER)
        p.undo_queue = p.undo_queue[1:]
        p.undone = [*p.undone, name]
        self._next_undo(io)

    def _undo_failed(self, name: str, io: HandlerIo, reason: str | None) -> None:
        """A participant says the undo of step ``name`` failed."""
        p = self.progress
        if p.undo_queue[:1] != [name]:
            return
        if p.undo_escalated == name:
            p.late = [*p.late, f"{name}:undo-failed-while-escalated"]
        elif self._compensating():
            self._retry_undo(self.orchestration.step(name), io, f"undo of {name} failed: {reason}")

    def _resume_compensation(self, io: HandlerIo, why: str) -> None:
        p = self.progress
        p.undo_escalated = None
        p.undo_failure = None
        p.state = None
        self.transition_to(_S.COMPENSATING, io.now, why)

    def _undo_refusal(self, decision: str) -> str | None:
        """Why ``decision`` cannot apply to the escalated undo, or None when it can."""
        if decision == "compensate":
            return (
                f"the saga is already compensating: the undo of step {self.progress.undo_escalated}"
                " waits on a person; decide retry (send the undo again) or skip (it was undone "
                "by hand, compensation goes on)"
            )
        return None

    def _resolve_undo(self, decision: str, io: HandlerIo, said: str) -> None:
        """A person's decision about the escalated undo: ``retry`` or ``skip``.

        ``retry`` sends the undo again with a fresh ``undo_retry`` schedule; ``skip`` takes it
        as done by hand (``progress.undone_by_hand``) and goes on with the earlier steps' undos.
        """
        p = self.progress
        name = p.undo_escalated
        assert name is not None
        step = self.orchestration.step(name)
        io.deadlines.cancel(STEP_TIMER)
        self._resume_compensation(io, f"undo of {name}: {said}")
        if decision == "retry":
            self._send_undo(step, 1, io)
            return
        p.undo_queue = p.undo_queue[1:]
        p.undone = [*p.undone, name]
        p.undone_by_hand = [*p.undone_by_hand, name]
        self._next_undo(io)

    def _escalate(self, io: HandlerIo, reason: str, step: Step | None, detail: str) -> None:
        escalation = Escalation(
            reason=reason,
            step=step.name if step else None,
            machine_state=str(self.machine_state),
            detail=detail,
        )
        io.commands.send(self.orchestration.escalation(self, escalation))
