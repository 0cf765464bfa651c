"""Declarations of orchestrated steps: what to send, how long to wait, how to undo.

Everything here is plain configuration, validated when the saga class is defined; the
orchestrator (``processor.machine.orchestrator``) interprets it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from processor._choices import choice_problem
from processor.errors import SagaDefinitionError
from processor.machine.retry import NO_RETRY, RetryPolicy
from processor.messages import Message

__all__ = [
    "DECISIONS",
    "DEFAULT_UNDO_RETRY",
    "Attempt",
    "Decision",
    "Escalation",
    "ExhaustedPolicy",
    "LateSuccess",
    "Orchestration",
    "Step",
    "StepTimer",
    "TimeoutPolicy",
]


@dataclass(frozen=True)
class Attempt:
    """What a command factory taking a second parameter is told about the command it builds.

    Attributes:
        number: The attempt, from 1 (a retry of the forward command or of its undo is 2, 3...).
        remaining: What is left of the saga's budget, or None when it has no deadline; a
            participant can pass it on so it does not start work it cannot finish in time.
    """

    number: int
    remaining: timedelta | None


CommandFactory = Callable[[Any], Message] | Callable[[Any, Attempt], Message]
"""``factory(saga)`` or ``factory(saga, attempt)``: builds a step's command from the state."""


@functools.cache
def takes_attempt(factory: Callable[..., Any]) -> bool:
    """Whether ``factory`` accepts a second positional argument (the :class:`Attempt`)."""
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    return len(positional) >= 2 or any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params)


LateSuccess = Literal["ignore", "undo"]
TimeoutPolicy = Literal["compensate", "escalate"]
SagaTimeoutPolicy = Literal["compensate", "escalate", "fail"]
ExhaustedPolicy = Literal["compensate", "escalate", "fail"]
Decision = Literal["retry", "skip", "compensate"]
DECISIONS: tuple[Decision, ...] = ("retry", "skip", "compensate")
"""What a person may decide for a step escalated to them (see ``OrchestratedSaga.resolve``)."""

DEFAULT_UNDO_RETRY = RetryPolicy(
    max_attempts=5, base_delay=timedelta(seconds=5), max_delay=timedelta(minutes=5)
)
"""Undos must finish, so they retry harder than forward steps by default."""


@dataclass(frozen=True)
class Step:
    """One forward step of an orchestrated saga.

    Attributes:
        name: Unique within the saga; names the step in replies, timers and history.
        action: Builds the forward command from the saga state, as ``action(saga)`` or
            ``action(saga, attempt)`` (see :class:`Attempt`).
        compensation: Builds the undo command the same way; None when the step changes nothing
            to undo.
        timeout: How long to wait for the reply to one attempt.
        retry: Retry policy of the forward command; only used when ``idempotent``.
        idempotent: Whether sending the command twice is safe (the receiver dedupes by saga id
            and step). Steps that are not are never retried.
        min_budget: The step is not started when less than this remains of the saga's budget.
        undo_timeout: How long to wait for the undo's reply; defaults to ``timeout``.
        undo_retry: Retry policy of the undo; undos are assumed idempotent.
        late_success: What a success arriving after compensation began means: ``"ignore"``
            (the receiver checked the deadline and did nothing real) or ``"undo"`` (the effect
            may have landed, so undo it too).
        late_window: How long compensation keeps listening for a late success of this step
            when ``late_success == "undo"`` and its outcome is unknown.
        waits_for_person: The step asks a person; the saga is WAITING while it runs.
        on_timeout: For steps that wait for a person: escalate (and keep waiting) or compensate
            when ``timeout`` passes.
        on_exhausted: When an attempt fails or times out and no retry is left: ``"compensate"``
            (undo what was done), ``"escalate"`` (the saga is WAITING on a person, who decides
            to retry, skip the step or compensate; see ``OrchestratedSaga.resolve``) or
            ``"fail"`` (end FAILED without undoing anything).
        escalation_timeout: While escalated, how often the person is reminded; the saga
            deadline, if any, still bounds the wait.
        breaker_wait: How long to wait before trying again when the participant answers that
            it cannot take the command now (an ``"unavailable"`` reply: its circuit breaker is
            open). That wait spends none of the step's retries; the saga deadline bounds it.
        state: The saga's own name for the time this step runs (``"CHARGING"``,
            ``"AWAITING_FRAUD_REVIEW"``), drawn by ``diagram`` inside the canonical RUNNING or
            WAITING state and kept in ``progress.state``; defaults to the step's name in
            capitals.

    Raises:
        SagaDefinitionError: A field's value is invalid (an unknown policy, a duration that is
            not a positive ``timedelta``...); every problem of the step is listed at once.
    """

    name: str
    action: CommandFactory
    compensation: CommandFactory | None = None
    timeout: timedelta = timedelta(seconds=30)
    retry: RetryPolicy = NO_RETRY
    idempotent: bool = False
    min_budget: timedelta = timedelta(0)
    undo_timeout: timedelta | None = None
    undo_retry: RetryPolicy = DEFAULT_UNDO_RETRY
    late_success: LateSuccess = "ignore"
    late_window: timedelta = timedelta(minutes=10)
    waits_for_person: bool = False
    on_timeout: TimeoutPolicy = "compensate"
    on_exhausted: ExhaustedPolicy = "compensate"
    escalation_timeout: timedelta = timedelta(days=1)
    breaker_wait: timedelta = timedelta(seconds=30)
    state: str | None = None

    def __post_init__(self) -> None:
        # Each field on its own, so a typo fails at this ``Step(...)`` line; how the fields
        # combine and how steps relate is checked by ``Orchestration``, all problems at once.
        problems = [
            p
            for p in (
                choice_problem("late_success", self.late_success, LateSuccess),
                choice_problem("on_timeout", self.on_timeout, TimeoutPolicy),
                choice_problem("on_exhausted", self.on_exhausted, ExhaustedPolicy),
            )
            if p is not None
        ]
        if not isinstance(self.name, str) or not self.name:
            problems.append("every step needs a name: Step('reserve', action=...)")
        if not callable(self.action):
            problems.append("action must be a function building the command from the saga")
        if self.compensation is not None and not callable(self.compensation):
            problems.append("compensation must be a function building the undo command, or None")
        for what, policy in (("retry", self.retry), ("undo_retry", self.undo_retry)):
            if not isinstance(policy, RetryPolicy):
                problems.append(f"{what} must be a RetryPolicy, not {policy!r}")
        durations = {
            "timeout": self.timeout,
            "escalation_timeout": self.escalation_timeout,
            "breaker_wait": self.breaker_wait,
            "undo_timeout": self.undo_timeout,
        }
        for what, value in durations.items():
            if value is None and what == "undo_timeout":
                continue
            if not isinstance(value, timedelta):
                problems.append(f"{what} must be a timedelta, not {value!r}")
            elif value <= timedelta(0):
                problems.append(f"{what} must be positive")
        for what, value in (("min_budget", self.min_budget), ("late_window", self.late_window)):
            if not isinstance(value, timedelta):
                problems.append(f"{what} must be a timedelta, not {value!r}")
        if problems:
            raise SagaDefinitionError(problems, subject=f"step {self.name!r}")

    @property
    def state_name(self) -> str:
        """:attr:`state`, or the step's name in capitals."""
        return self.state or self.name.upper().replace("-", "_").replace(" ", "_")

    @property
    def retries(self) -> bool:
        """Whether a failed or timed-out attempt may be tried again."""
        return self.idempotent and self.retry.max_attempts > 1


class Escalation(BaseModel):
    """What a person is told when the saga needs one.

    Attributes:
        reason: ``"compensation-failed"``, ``"approval-timeout"``, ``"saga-timeout"``,
            ``"retries-exhausted"`` or ``"still-waiting"`` (a reminder).
        step: The step concerned, if any.
        machine_state: The saga's machine state when it escalated.
        detail: Free text for the person.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: str
    step: str | None
    machine_state: str
    detail: str


EscalationFactory = Callable[[Any, Escalation], Message]


class StepTimer(BaseModel):
    """Payload of the orchestrator's step timer.

    Attributes:
        step: Step name.
        phase: ``"forward"`` or ``"undo"``.
        purpose: ``"timeout"`` (waiting for a reply), ``"retry"`` (backing off), ``"resume"``
            (waiting out an open breaker), ``"late"`` (listening for a late success) or
            ``"escalated"`` (reminding the person).
        attempt: Attempt the timer belongs to; a timer of an older attempt is ignored.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: str
    phase: Literal["forward", "undo"]
    purpose: Literal["timeout", "retry", "resume", "late", "escalated"]
    attempt: int


@dataclass(frozen=True)
class Orchestration:
    """The ordered steps of a saga and its saga-wide policies.

    Attributes:
        steps: Forward steps in order.
        sla: Whole-saga budget, counted from the start; None for no saga deadline.
        on_saga_timeout: When the saga deadline fires: compensate completed steps, escalate
            to a person and stop, or fail (stop without undoing anything).
        escalation: Builds the command sent to a person (compensation failed, an approval timed
            out, or the saga timed out under the escalate policy).
    """

    steps: Sequence[Step]
    escalation: EscalationFactory
    sla: timedelta | None = None
    on_saga_timeout: SagaTimeoutPolicy = "compensate"
    _by_name: dict[str, Step] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        strays = [f"{s!r} is not a Step" for s in self.steps if not isinstance(s, Step)]
        if strays:
            raise SagaDefinitionError(strays, subject="orchestration")
        problems: list[str] = []
        names = [s.name for s in self.steps]
        if not names:
            problems.append("declare at least one step")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            problems.append(f"step names must be unique; repeated: {dupes}")
        states = [s.state_name for s in self.steps]
        canonical = {"NEW", "RUNNING", "WAITING", "COMPENSATING", "COMPLETED", "FAILED"}
        canonical |= {"COMPENSATION_FAILED", "TIMED_OUT"}
        clashes = sorted({n for n in states if states.count(n) > 1 or n in canonical})
        if clashes:
            problems.append(
                f"step states must be unique and not a canonical state's name; clashing: {clashes}"
            )
        for n in states:
            if not n.replace("_", "").isalnum():
                problems.append(f"step state {n!r}: use letters, digits and underscores")
        for s in self.steps:
            if s.retry.max_attempts > 1 and not s.idempotent:
                problems.append(
                    f"step {s.name!r} has a retry policy but is not idempotent; mark it "
                    "idempotent=True (the receiver dedupes) or drop the retries"
                )
            if s.late_success == "undo" and s.compensation is None:
                problems.append(f"step {s.name!r}: late_success='undo' needs a compensation")
            if s.on_timeout == "escalate" and not s.waits_for_person:
                problems.append(
                    f"step {s.name!r}: only steps that wait for a person escalate on timeout; "
                    "use on_exhausted='escalate' to hand a failing step to a person"
                )
        wrong = choice_problem("on_saga_timeout", self.on_saga_timeout, SagaTimeoutPolicy)
        if wrong is not None:
            problems.append(wrong)
        if not callable(self.escalation):
            problems.append("escalation must be a function building the command sent to a person")
        if self.sla is not None and not isinstance(self.sla, timedelta):
            problems.append(f"sla must be a timedelta or None, not {self.sla!r}")
        elif self.sla is not None and self.sla <= timedelta(0):
            problems.append("sla must be positive")
        if problems:
            raise SagaDefinitionError(problems, subject="orchestration")
        object.__setattr__(self, "_by_name", {s.name: s for s in self.steps})

    def step(self, name: str) -> Step:
        """Return the step called ``name``."""
        return self._by_name[name]

    def index(self, name: str) -> int:
        """Return the position of step ``name``."""
        return [s.name for s in self.steps].index(name)

    @property
    def has_waiting(self) -> bool:
        """Whether any step waits for a person."""
        return any(s.waits_for_person for s in self.steps)
