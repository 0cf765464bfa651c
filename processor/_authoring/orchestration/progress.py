"""What an orchestrated saga stores about its run, and the names of its two timers.

:class:`Progress` is saved with the saga state, so every decision the orchestrator takes is a
pure function of it and the input; :class:`HandlerIo` bundles the handles a handler was given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from processor._authoring.handles import SagaCommands, SagaDeadlines, SagaLifecycle
from processor._authoring.orchestration.retry import RetryPolicy

__all__ = [
    "SAGA_DEADLINE",
    "STEP_TIMER",
    "HandlerIo",
    "Progress",
    "ReplyHandler",
    "ReplyKind",
]

STEP_TIMER = "machine.step"
SAGA_DEADLINE = "machine.deadline"

ReplyKind = Literal["succeeded", "failed", "rejected", "unavailable", "undone", "undo-failed"]
ReplyHandler = Callable[..., None]
"""Type of the handlers :func:`on_reply` returns; annotate them ``ClassVar[ReplyHandler]``."""


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
        undone: Undos that are done, in the order they finished (those a person marked done
            by hand included).
        undone_by_hand: Undos a person marked done (``saga resolve ... skip``) after they ran
            out of retries.
        undo_escalated: The step whose undo ran out of retries and now waits on a person's
            decision (retry the undo, or skip it as done by hand); compensation is paused.
        undo_failure: Why that undo failed, for the person (``"undo of pay failed: ..."``).
        in_doubt: Steps whose outcome is unknown and whose late success must be undone.
        late: Late replies observed, as ``"step:ignored"`` or ``"step:undo"``, and decisions
            that came when nothing waited for one.
        state: The saga's own name for where it is (the running step's ``state_name``, with
            ``_ESCALATED`` while a person decides for it; ``_UNDO`` while its undo runs and
            ``_UNDO_ESCALATED`` while a person decides for that); None otherwise.
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
    undone_by_hand: list[str] = Field(default_factory=list)
    undo_escalated: str | None = None
    undo_failure: str | None = None
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

    @model_serializer(mode="wrap")
    def _without_unused_undo_fields(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Written only once used: a replica still on the code before them (``extra="forbid"``)
        # reads every other saga during a rolling update, and parks only those a person was
        # asked about an undo, which it could not handle anyway.
        data = handler(self)
        if isinstance(data, dict):
            for name in _UNDO_FIELDS:
                if not data.get(name):
                    data.pop(name, None)
        return data


_UNDO_FIELDS = ("undone_by_hand", "undo_escalated", "undo_failure")


@dataclass(frozen=True)
class HandlerIo:
    """The handles of the handler being run, passed down the orchestrator's steps together.

    A handler may ask for them in one parameter (``io: HandlerIo``), e.g. to call
    ``self.begin(event, io)`` from a start handler written by hand.
    """

    # The runner builds a parameter of a class marked so from the run's three handles, in
    # this order (see ``processor._authoring.params``): the engine itself never imports this
    # package.
    __saga_handles__: ClassVar[bool] = True

    commands: SagaCommands
    deadlines: SagaDeadlines
    lifecycle: SagaLifecycle

    @property
    def now(self) -> datetime:
        """The handler's clock (that of its deadlines handle)."""
        return self.deadlines.now
