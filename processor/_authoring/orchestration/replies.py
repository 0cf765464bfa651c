"""Reply handlers of orchestrated sagas: declaring them, and checking they match the steps.

:func:`on_reply` and :func:`on_decision` build, in a saga class body, the event handlers that
pass a participant's reply or a person's decision to the orchestrator. The checks run when
``@saga`` defines the class (problems) and in ``lint-saga`` (warnings).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from processor._authoring.choices import choice_problem, did_you_mean
from processor._authoring.definition import saga_event_handler
from processor._authoring.handles import SagaCommands, SagaDeadlines, SagaLifecycle
from processor._authoring.marks import SAGA, class_attributes, tag
from processor._authoring.messages import Message
from processor._authoring.orchestration.progress import HandlerIo, ReplyHandler, ReplyKind
from processor._authoring.orchestration.steps import Orchestration
from processor._errors import SagaDefinitionError

if TYPE_CHECKING:
    from processor._authoring.orchestration.driven import Driven
    from processor._authoring.orchestration.stepping import StepMachine

__all__ = [
    "build_handler",
    "on_decision",
    "on_reply",
    "reply_handlers",
    "reply_problems",
    "wiring_warnings",
]

_REPLY_OF = "__saga_reply_of__"
_UNDO_KINDS = ("undone", "undo-failed")


def on_reply(
    event_type: type[Message],
    *,
    step: str,
    kind: ReplyKind = "succeeded",
    association_property: str | None = None,
    reason_field: str | None = "reason",
) -> ReplyHandler:
    """Declare, in a saga class body, the handler of a participant's reply.

    ``Step(..., replies=Replies(...))`` declares the same handlers beside the step; a reply
    class is declared one way or the other, once.

    Example:
        ``on_reserved: ClassVar[ReplyHandler] = on_reply(StockReserved, step="reserve",
        association_property="order_id")``

    Args:
        event_type: The reply event class.
        step: Step the reply is about.
        kind: What the reply means (see :meth:`OrchestratedSaga.reply`).
        association_property: Field of the event holding the saga id; defaults to the saga's
            (``@saga(..., association_property=...)``).
        reason_field: Field of the event holding a failure reason, if any.

    Returns:
        A handler function, marked like one written with ``@saga_event_handler``.

    Raises:
        SagaDefinitionError: ``kind`` is not a :data:`ReplyKind` (an unknown kind used to be
            ignored, and taken for ``"undo-failed"`` during compensation), ``event_type`` is
            not a message class, or ``reason_field`` is not one of its fields.
    """
    where = f"on_reply({getattr(event_type, '__name__', event_type)}, step={step!r})"
    problems = _field_problems(event_type, reason_field=reason_field)
    wrong = choice_problem("kind", kind, ReplyKind)
    if wrong is not None:
        problems.append(wrong)
    if not isinstance(step, str) or not step:
        problems.append("step= must name one of the orchestration's steps")
    if problems:
        raise SagaDefinitionError(problems, subject=where)

    def apply(saga: Driven, event: Any, io: HandlerIo) -> None:
        reason = getattr(event, reason_field, None) if reason_field else None
        saga.reply(step, kind, io.commands, io.deadlines, io.lifecycle, reason=reason)

    return build_handler(apply, event_type, association_property, reply_of=(step, kind))


def on_decision(
    event_type: type[Message],
    *,
    association_property: str | None = None,
    decision_field: str = "decision",
    reason_field: str | None = "reason",
) -> ReplyHandler:
    """Declare the handler of an event that carries a person's decision on an escalated step.

    The event's ``decision_field`` holds ``"retry"``, ``"skip"`` or ``"compensate"`` (see
    :meth:`OrchestratedSaga.resolve`); an operator can decide the same with ``saga resolve``.

    Args:
        event_type: The decision event class.
        association_property: Field of the event holding the saga id; defaults to the saga's.
        decision_field: Field of the event holding the decision.
        reason_field: Field of the event holding why, if any.

    Returns:
        A handler function, marked like one written with ``@saga_event_handler``.

    Raises:
        SagaDefinitionError: ``event_type`` is not a message class, or ``decision_field`` or
            ``reason_field`` is not one of its fields.
    """
    problems = _field_problems(event_type, reason_field=reason_field, decision_field=decision_field)
    if problems:
        name = getattr(event_type, "__name__", event_type)
        raise SagaDefinitionError(problems, subject=f"on_decision({name})")

    def apply(saga: Driven, event: Any, io: HandlerIo) -> None:
        decision = str(getattr(event, decision_field))
        reason = getattr(event, reason_field, None) if reason_field else None
        saga.resolve(decision, io.commands, io.deadlines, io.lifecycle, reason=reason)  # type: ignore[arg-type]

    return build_handler(apply, event_type, association_property)


def _field_problems(event_type: object, **fields: str | None) -> list[str]:
    """The event must be a message class, and each named field one of its fields.

    ``reason_field`` defaults to ``"reason"`` for events with and without one, so only a
    reason field named explicitly must exist; the others must always.
    """
    if not (isinstance(event_type, type) and issubclass(event_type, Message)):
        return [f"{event_type!r} is not a Message subclass; pass the event class"]
    declared = event_type.model_fields
    problems = []
    for parameter, name in fields.items():
        if name is None or name in declared or (parameter, name) == ("reason_field", "reason"):
            continue
        wrong = choice_problem(parameter, name, declared)
        problems.append(f"{wrong} (the fields of {event_type.__name__})")
    return problems


def build_handler(
    apply: Callable[..., None],
    event_type: type[Message],
    association_property: str | None,
    *,
    reply_of: tuple[str, ReplyKind] | None = None,
    start: bool = False,
    settings: Mapping[str, Any] | None = None,
    spelling: str | None = None,
) -> ReplyHandler:
    """A handler calling ``apply``, named and marked as ``@saga_event_handler`` would leave it.

    Args:
        apply: Called as ``apply(saga, event, io, **settings)``.
        event_type: The event handled.
        association_property: Its field holding the saga id; None for the saga's.
        reply_of: ``(step, kind)`` of a reply handler.
        start: The event starts the saga.
        settings: Extra parameters by name, each ``Annotated[type, Setting(...)]``: the
            runtime resolves them as it does a hand-written handler's.
        spelling: How the handler was declared, for messages (``"on_reply(...)"``).
    """
    extra = dict(settings or {})

    def handler(
        self: Driven,
        event: Any,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        **configured: Any,
    ) -> None:
        apply(self, event, HandlerIo(commands, deadlines, lifecycle), **configured)

    if reply_of is not None:
        setattr(handler, _REPLY_OF, reply_of)
    # The handler name keys the runtime's parameter table, so it must be unique per saga; the
    # event type is (one handler per event type).
    handler.__name__ = f"on_{event_type.__name__}"
    handler.__qualname__ = handler.__name__
    handles = {"commands": SagaCommands, "deadlines": SagaDeadlines, "lifecycle": SagaLifecycle}
    handler.__annotations__ = {"event": event_type, **handles, **extra, "return": None}
    # What the runtime reads: the handles and the settings by name, no ``**configured``.
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    handler.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("self", positional),
            inspect.Parameter("event", positional, annotation=event_type),
            *(inspect.Parameter(n, positional, annotation=t) for n, t in handles.items()),
            *(
                inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=t)
                for n, t in extra.items()
            ),
        ],
        return_annotation=None,
    )
    marked: Callable[..., None] = saga_event_handler(
        event_type, association_property=association_property, start=start
    )(handler)
    tag(marked, SAGA, spelling or ("on_reply(...)" if reply_of else "on_decision(...)"))
    return marked


def reply_handlers(cls: type) -> Iterator[tuple[str, str, ReplyKind]]:
    """``(handler name, step, kind)`` of every :func:`on_reply` handler of the class."""
    for name, attr in class_attributes(cls):
        found = getattr(attr, _REPLY_OF, None)
        if found is not None:
            yield name, found[0], found[1]


def reply_problems(cls: type[StepMachine]) -> list[str]:
    """Reply handlers must name declared steps; undo replies need a step with an undo."""
    o = getattr(cls, "orchestration", None)
    if not isinstance(o, Orchestration):
        return [f"set orchestration = Orchestration(steps=...) on {cls.__qualname__}"]
    steps = {s.name: s for s in o.steps}
    problems = []
    for handler, name, kind in reply_handlers(cls):
        step = steps.get(name)
        if step is None:
            problems.append(
                f"reply handler {handler} names step {name!r}, which the orchestration "
                f"does not declare (its steps: {', '.join(steps)}){did_you_mean(name, steps)}"
            )
        elif kind in _UNDO_KINDS and step.compensation is None:
            problems.append(
                f"reply handler {handler} reports the undo ({kind}) of step {name!r}, "
                "which declares no compensation"
            )
    return problems


def wiring_warnings(cls: type[StepMachine]) -> list[str]:
    """What ``lint-saga`` warns of: steps only a timeout can move past.

    Not import errors: a handler written by hand may call ``reply`` itself.
    """
    kinds: dict[str, set[str]] = {}
    for _, name, kind in reply_handlers(cls):
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
                "handler: every undo waits for its timeouts and is escalated to a person"
            )
    return warnings
