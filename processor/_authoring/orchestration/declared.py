"""What a step and an orchestration declare beside their policies.

:class:`Replies` names, on a ``Step``, the reply types that move it; :class:`SettingKeys` names,
on an ``Orchestration``, the settings its timers and retry schedules come from;
:func:`start_event` is the default of the state field the start event is kept in. The saga
class turns them into handlers (:mod:`processor._authoring.orchestration.generated`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pydantic import Field

from processor._authoring.messages import Message
from processor._authoring.orchestration.progress import ReplyKind
from processor._errors import SagaDefinitionError

__all__ = ["Replies", "ReplyTypes", "SettingKeys", "start_event"]

ReplyTypes = type[Message] | tuple[type[Message], ...] | None
"""One reply class, several (``(HotelFailed, HotelTimedOut)``), or None."""

# Field of Replies -> the reply kind it declares (``undo_failed`` is the kind ``undo-failed``).
_KINDS: dict[str, ReplyKind] = {
    "succeeded": "succeeded",
    "rejected": "rejected",
    "failed": "failed",
    "unavailable": "unavailable",
    "undone": "undone",
    "undo_failed": "undo-failed",
}
UNDO_FIELDS = ("undone", "undo_failed")


@dataclass(frozen=True)
class Replies:
    """The replies that move a step, by what they mean; ``Step(..., replies=Replies(...))``.

    The saga class generates one handler per reply class, as ``on_reply(cls, step=...,
    kind=...)`` would, keyed by the saga's association property
    (``@saga(..., association_property=...)``).

    Attributes:
        succeeded: The step did what it was asked; the saga moves on.
        rejected: A business refusal, never retried; the saga compensates (or what
            ``on_exhausted`` says).
        failed: The step failed and may be retried.
        unavailable: The participant did not run the command (its breaker is open); the same
            attempt is sent again after the step's ``breaker_wait``.
        undone: The compensation is done.
        undo_failed: The compensation failed; it is retried by ``undo_retry``, then escalated.

    Raises:
        SagaDefinitionError: A value is not a message class (or a tuple of them), or one
            class is given twice; every problem at once.
    """

    succeeded: ReplyTypes = None
    rejected: ReplyTypes = None
    failed: ReplyTypes = None
    unavailable: ReplyTypes = None
    undone: ReplyTypes = None
    undo_failed: ReplyTypes = None

    def __post_init__(self) -> None:
        problems: list[str] = []
        seen: dict[type[Message], str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            for cls in value if isinstance(value, tuple) else (value,):
                if cls is None:
                    continue
                if not (isinstance(cls, type) and issubclass(cls, Message)):
                    problems.append(f"{f.name}={cls!r} is not a Message subclass")
                elif cls in seen:
                    problems.append(
                        f"{cls.__name__} is given twice ({seen[cls]}= and {f.name}=); a reply "
                        "means one thing"
                    )
                else:
                    seen[cls] = f.name
        if problems:
            raise SagaDefinitionError(problems, subject="Replies(...)")

    def declared(self) -> list[tuple[type[Message], ReplyKind, str]]:
        """``(reply class, kind, field name)`` of every reply declared, in field order."""
        out = []
        for name, kind in _KINDS.items():
            value = getattr(self, name)
            for cls in value if isinstance(value, tuple) else (value,):
                if cls is not None:
                    out.append((cls, kind, name))
        return out


@dataclass(frozen=True)
class SettingKeys:
    """The settings an orchestration's timers and retry schedules come from.

    The generated start handler (``Orchestration(start=...)``) reads each key, defaulting to the
    value the orchestration declares, and passes them to ``begin`` as ``sla=``, ``timeouts=``,
    ``retries=`` and ``late_windows=``; they are stored with the saga, so a running saga keeps
    the schedule it started with. A timeout is given as ``"PT15M"`` or seconds, a retry policy
    as ``{"max_attempts": 5, "base_delay": "PT1M"}``.

    Example:
        ``SettingKeys(sla="order.sla", timeouts={"pay": "order.payment-timeout"})``

    Attributes:
        sla: Key of the whole-saga budget.
        timeouts: Keys of step timeouts, by step name.
        retries: Keys of retry policies, by step name (idempotent steps only).
        late_windows: Keys of late-success windows, by step name.
    """

    sla: str | None = None
    timeouts: Mapping[str, str] = field(default_factory=dict)
    retries: Mapping[str, str] = field(default_factory=dict)
    late_windows: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        keys = [("sla", self.sla)] if self.sla is not None else []
        for what in ("timeouts", "retries", "late_windows"):
            given = getattr(self, what)
            if not isinstance(given, Mapping):
                keys.append((what, given))
                continue
            keys.extend((f"{what}[{step!r}]", key) for step, key in given.items())
        problems = [
            f"{where} must be a non-empty settings key such as 'order.payment-timeout', not {key!r}"
            for where, key in keys
            if not isinstance(key, str) or not key
        ]
        if problems:
            raise SagaDefinitionError(problems, subject="SettingKeys(...)")

    def by_step(self) -> list[tuple[str, str, str]]:
        """``(what, step, key)`` of every per-step key; ``what`` is ``timeouts`` and so on."""
        return [
            (what, step, key)
            for what in ("timeouts", "retries", "late_windows")
            for step, key in getattr(self, what).items()
        ]


def start_event() -> Any:
    """The default of the state field that keeps the start event.

    ``trip: BookTrip = start_event()`` declares a field typed with the start event itself, not
    ``BookTrip | None``, so a step builder reads ``t.trip.hotel`` and mypy checks it. The field
    holds None only before the start handler runs, when no builder runs; ``begin`` sets it
    before the first step is sent, and it is saved with the rest of the state.

    Returns:
        A pydantic field default (None, not validated until the start handler ran).
    """
    return Field(default=None)
