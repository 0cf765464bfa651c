"""What a handler run takes in (an event or a fired deadline) and what it gives back."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from processor._authoring.definition import SagaState
from processor._authoring.handles import CommandIntent, DeadlineOp
from processor._authoring.messages import Message, MessageMetadata

__all__ = ["DeadlineInput", "EventInput", "Outcome"]


# Not frozen: a frozen dataclass sets each field through object.__setattr__ (about 0.1 us a
# field), and one is built per handler run; nothing changes it once built.
@dataclass(slots=True)
class EventInput:
    """An event delivered to a saga.

    Attributes:
        message: The decoded event.
        metadata: Where it came from.
    """

    message: Message
    metadata: MessageMetadata


@dataclass(frozen=True)
class DeadlineInput:
    """A deadline that fired.

    Attributes:
        name: Deadline name.
        deadline_id: Store id of the deadline row.
        payload: JSON form of the payload given at scheduling, or None.
        due_at: When it was due.
    """

    name: str
    deadline_id: str
    payload: Any
    due_at: datetime


# Not frozen: a frozen dataclass sets each field through object.__setattr__ (about 0.1 us a
# field), and one is built per handler run; nothing changes it once built.
@dataclass(slots=True)
class Outcome:
    """What a handler invocation decided.

    Attributes:
        state: The new state (a copy; the input state is never mutated).
        commands: Commands to send, in order.
        deadlines: Deadline schedules and cancellations, in order.
        ended: Whether the saga ended; the store then cancels all its deadlines.
        handler_name: Name of the handler that ran.
        escalated: Why the saga now waits on a person (``SagaLifecycle.escalate``), if it does.
        escalation: What kind of wait that is, a short fixed word for the metrics: ``"handler"``
            (a plain handler's ``escalate``), or the saga's own ``waiting_kind()`` (an
            orchestrated saga's ``"step"`` or ``"undo"``).
        outcome: How it ended, when ``ended`` and the saga said so
            (:class:`~processor._authoring.handles.SagaOutcome`); the engine counts an end without
            one as ``COMPLETED``.
    """

    state: SagaState
    commands: list[CommandIntent]
    deadlines: list[DeadlineOp]
    ended: bool
    handler_name: str
    outcome: str | None = None
    escalated: str | None = None
    escalation: str | None = None
