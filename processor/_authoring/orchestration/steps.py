"""Declarations of orchestrated steps: what to send, how long to wait, how to undo.

Everything here is plain configuration, validated when the saga class is defined; the
orchestrator (``processor._authoring.orchestration.orchestrator``) interprets it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, Literal, Protocol, cast

from pydantic import BaseModel, ConfigDict
from typing_extensions import TypeVar

from processor._authoring.choices import choice_problem, did_you_mean
from processor._authoring.messages import Message
from processor._authoring.orchestration.declared import UNDO_FIELDS, Replies, SettingKeys
from processor._authoring.orchestration.retry import NO_RETRY, RetryPolicy
from processor._errors import SagaDefinitionError

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


S = TypeVar("S", default=Any)
"""The saga class a step's builders receive: ``Orchestration["TripSaga"](...)`` types them."""
_S_contra = TypeVar("_S_contra", contravariant=True, default=Any)


class AttemptFactory(Protocol[_S_contra]):
    """A command builder that also takes the :class:`Attempt`: ``factory(saga, attempt)``."""

    def __call__(self, saga: _S_contra, attempt: Attempt, /) -> Message:
        """Build the command."""
        ...


# One plain callable in the union, so mypy types a lambda builder's parameter from it (it
# infers nothing from a union of two callables); the attempt-taking form is a protocol, which
# a function matches. A lambda taking the attempt is not inferred: write it as a function.
CommandFactory = Callable[[S], Message] | AttemptFactory[S]
"""``factory(saga)`` or ``factory(saga, attempt)``: builds a step's command from the state."""


def takes_attempt(factory: CommandFactory[Any]) -> bool:
    """Whether ``factory`` accepts a second positional argument (the :class:`Attempt`)."""
    # A function is hashable; mypy does not know a callback protocol's instances are.
    return _takes_attempt(cast("Callable[..., Any]", factory))


@functools.cache
def _takes_attempt(factory: Callable[..., Any]) -> bool:
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
class Step(Generic[S]):
    """One forward step of an orchestrated saga.

    Generic in the saga class its builders receive (``Step[TripSaga]``, usually inferred from
    ``Orchestration["TripSaga"](...)``), so mypy checks what a builder reads from the saga.

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
        replies: The reply classes that move the step, by what they mean
            (``Replies(succeeded=HotelReserved, rejected=HotelUnavailable,
            undone=HotelCancelled)``); the saga class generates their handlers. Replies can
            also be declared with ``on_reply`` in the class body, but each class only once.

    Raises:
        SagaDefinitionError: A field's value is invalid (an unknown policy, a duration that is
            not a positive ``timedelta``...); every problem of the step is listed at once.
    """

    name: str
    action: CommandFactory[S]
    compensation: CommandFactory[S] | None = None
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
    replies: Replies = field(default_factory=Replies)

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
        if not isinstance(self.replies, Replies):
            problems.append(f"replies must be Replies(succeeded=..., ...), not {self.replies!r}")
        elif self.compensation is None:
            problems.extend(
                f"replies: {kind}={cls.__name__} reports an undo, but the step declares no "
                "compensation"
                for cls, _, kind in self.replies.declared()
                if kind in UNDO_FIELDS
            )
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


EscalationFactory = Callable[[S, Escalation], Message]


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
class Orchestration(Generic[S]):
    """The ordered steps of a saga and its saga-wide policies.

    Generic in the saga class, so that ``Orchestration["TripSaga"](steps=(Step("flight",
    action=lambda t: ReserveFlight(trip_id=t.trip.trip_id)), ...))`` has mypy check what each
    builder reads; ``Orchestration(...)`` alone leaves the builders untyped.

    Attributes:
        steps: Forward steps in order.
        sla: Whole-saga budget, counted from the start; None for no saga deadline.
        on_saga_timeout: When the saga deadline fires: compensate completed steps, escalate
            to a person and stop, or fail (stop without undoing anything).
        escalation: Builds the command sent to a person (compensation failed, an approval timed
            out, or the saga timed out under the escalate policy).
        start: The event that starts the saga. The saga class then generates its start
            handler: it keeps the event on the state (in the field typed with its class, and in
            the fields named like the event's) and calls ``begin``. None when the saga writes
            its own start handler.
        settings: The settings the generated start handler reads the saga deadline, step
            timeouts, retry policies and late windows from (see :class:`SettingKeys`).
    """

    steps: Sequence[Step[S]]
    escalation: EscalationFactory[S]
    sla: timedelta | None = None
    on_saga_timeout: SagaTimeoutPolicy = "compensate"
    start: type[Message] | None = None
    settings: SettingKeys = field(default_factory=SettingKeys)
    _by_name: dict[str, Step[S]] = field(init=False, repr=False, compare=False)

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
        canonical |= {"COMPENSATED", "COMPENSATION_FAILED", "TIMED_OUT"}
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
        problems.extend(self._declaration_problems())
        if problems:
            raise SagaDefinitionError(problems, subject="orchestration")
        object.__setattr__(self, "_by_name", {s.name: s for s in self.steps})

    def _declaration_problems(self) -> list[str]:
        """A reply class moves one step one way; settings name declared steps."""
        problems = []
        start = self.start
        if start is not None and not (isinstance(start, type) and issubclass(start, Message)):
            problems.append(f"start={start!r} must be the start event's class")
            start = None
        where: dict[type[Message], str] = {} if start is None else {start: "start="}
        for s in self.steps:
            for cls, _, kind in s.replies.declared() if isinstance(s.replies, Replies) else ():
                here = f"Step({s.name!r}, replies=Replies({kind}=...))"
                if cls in where:
                    problems.append(
                        f"{cls.__name__} is declared twice, by {where[cls]} and by {here}; "
                        "a message moves one step one way, so keep one"
                    )
                where.setdefault(cls, here)
        if not isinstance(self.settings, SettingKeys):
            return [*problems, f"settings must be SettingKeys(...), not {self.settings!r}"]
        if self.settings != SettingKeys() and start is None:
            problems.append(
                "settings= are read by the generated start handler: declare start=EventClass, "
                "or read them in your own start handler and pass them to begin()"
            )
        if self.settings.sla is not None and self.sla is None:
            problems.append("settings: sla= is read from a setting, so declare a default sla=")
        steps = {s.name: s for s in self.steps}
        for what, name, _ in self.settings.by_step():
            if name not in steps:
                problems.append(
                    f"settings: {what} for step {name!r}, which the orchestration does not "
                    f"declare{did_you_mean(name, steps)}"
                )
            elif what == "retries" and not steps[name].idempotent:
                problems.append(
                    f"settings: retries for step {name!r}, which is not idempotent; mark it "
                    "idempotent=True or read no retry policy for it"
                )
        return problems

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
