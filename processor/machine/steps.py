"""Declarations of orchestrated steps: what to send, how long to wait, how to undo.

Everything here is plain configuration, validated when the saga class is defined; the
orchestrator (``processor.machine.orchestrator``) interprets it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from processor.errors import SagaDefinitionError
from processor.machine.retry import NO_RETRY, RetryPolicy
from processor.messages import Message

__all__ = [
    "DEFAULT_UNDO_RETRY",
    "Escalation",
    "LateSuccess",
    "Orchestration",
    "Step",
    "StepTimer",
    "TimeoutPolicy",
]

CommandFactory = Callable[[Any], Message]
LateSuccess = Literal["ignore", "undo"]
TimeoutPolicy = Literal["compensate", "escalate"]

DEFAULT_UNDO_RETRY = RetryPolicy(
    max_attempts=5, base_delay=timedelta(seconds=5), max_delay=timedelta(minutes=5)
)
"""Undos must finish, so they retry harder than forward steps by default."""


@dataclass(frozen=True)
class Step:
    """One forward step of an orchestrated saga.

    Attributes:
        name: Unique within the saga; names the step in replies, timers and history.
        action: Builds the forward command from the saga state.
        compensation: Builds the undo command; None when the step changes nothing to undo.
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

    @property
    def retries(self) -> bool:
        """Whether a failed or timed-out attempt may be tried again."""
        return self.idempotent and self.retry.max_attempts > 1


class Escalation(BaseModel):
    """What a person is told when the saga needs one.

    Attributes:
        reason: ``"compensation-failed"``, ``"approval-timeout"`` or ``"saga-timeout"``.
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
        purpose: ``"timeout"`` (waiting for a reply), ``"retry"`` (backing off) or ``"late"``
            (listening for a late success).
        attempt: Attempt the timer belongs to; a timer of an older attempt is ignored.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: str
    phase: Literal["forward", "undo"]
    purpose: Literal["timeout", "retry", "late"]
    attempt: int


@dataclass(frozen=True)
class Orchestration:
    """The ordered steps of a saga and its saga-wide policies.

    Attributes:
        steps: Forward steps in order.
        sla: Whole-saga budget, counted from the start; None for no saga deadline.
        on_saga_timeout: When the saga deadline fires: compensate completed steps, or escalate
            to a person and stop.
        escalation: Builds the command sent to a person (compensation failed, an approval timed
            out, or the saga timed out under the escalate policy).
    """

    steps: Sequence[Step]
    escalation: EscalationFactory
    sla: timedelta | None = None
    on_saga_timeout: TimeoutPolicy = "compensate"
    _by_name: dict[str, Step] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems: list[str] = []
        names = [s.name for s in self.steps]
        if not names:
            problems.append("declare at least one step")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            problems.append(f"step names must be unique; repeated: {dupes}")
        for s in self.steps:
            if not s.name:
                problems.append("every step needs a name")
            if s.timeout <= timedelta(0):
                problems.append(f"step {s.name!r}: timeout must be positive")
            if s.retry.max_attempts > 1 and not s.idempotent:
                problems.append(
                    f"step {s.name!r} has a retry policy but is not idempotent; mark it "
                    "idempotent=True (the receiver dedupes) or drop the retries"
                )
            if s.late_success == "undo" and s.compensation is None:
                problems.append(f"step {s.name!r}: late_success='undo' needs a compensation")
            if s.on_timeout == "escalate" and not s.waits_for_person:
                problems.append(
                    f"step {s.name!r}: only steps that wait for a person escalate on timeout"
                )
        if self.sla is not None and self.sla <= timedelta(0):
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
