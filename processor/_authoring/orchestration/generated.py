"""The handlers an orchestration declares: its steps' replies' and its start event's.

``Step(..., replies=Replies(...))`` and ``Orchestration(start=...)`` become, when the saga class
is created, the handlers that ``on_reply(...)`` and a start handler calling ``begin`` would be
(they are built by the same code). They are set on the class as ``on_<EventClass>``, so
``@saga`` checks them with the others (the association property, one handler per event) and
``lint-saga``, ``diagram`` and the history name them as before.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

from processor._authoring.definition import definition_of
from processor._authoring.handles import Setting
from processor._authoring.marks import class_attributes, spelling
from processor._authoring.messages import Message
from processor._authoring.orchestration.progress import HandlerIo, ReplyHandler
from processor._authoring.orchestration.replies import build_handler, on_reply
from processor._authoring.orchestration.retry import RetryPolicy
from processor._authoring.orchestration.stepping import StepMachine
from processor._authoring.orchestration.steps import Orchestration
from processor._authoring.saga_model import handled_event

if TYPE_CHECKING:
    from processor._authoring.orchestration.driven import Driven

__all__ = ["declaration_problems", "install", "keep_start"]

_DECLARED_BY = "__saga_declared_by__"


def _declarations(o: Orchestration) -> Iterator[tuple[type[Message], str | None, Any, str]]:
    """``(event class, step, kind, where it is declared)``; the start event's kind is None."""
    if o.start is not None:
        yield o.start, None, None, "Orchestration(start=...)"
    for s in o.steps:
        for cls, kind, name in s.replies.declared():
            yield cls, s.name, kind, f"Step({s.name!r}, replies=Replies({name}=...))"


def _by_hand(cls: type) -> dict[type[Message], str]:
    """The event handlers the class (or a base) declares itself, by event class."""
    found: dict[type[Message], str] = {}
    for name, attr in class_attributes(cls):
        if not callable(attr) or getattr(attr, _DECLARED_BY, None) is not None:
            continue
        event = handled_event(attr)
        if event is not None:
            found.setdefault(event, f"{name} = {spelling(attr) or 'a handler'}")
    return found


def install(cls: type[StepMachine]) -> None:
    """Set on ``cls`` the handlers its orchestration declares; called as the class is created.

    An event the class handles itself gets no generated handler: :func:`declaration_problems`
    reports the conflict when ``@saga`` checks the class.
    """
    o = getattr(cls, "orchestration", None)
    if not isinstance(o, Orchestration):
        return
    by_hand = _by_hand(cls)
    made: dict[str, Callable[..., None]] = {}
    for event, step, kind, where in _declarations(o):
        if event in by_hand:
            continue
        handler = _start_handler(o) if step is None else on_reply(event, step=step, kind=kind)
        setattr(handler, _DECLARED_BY, where)
        made[handler.__name__] = handler
    own = vars(cls)
    for klass in cls.__mro__[1:]:
        for name, attr in vars(klass).items():
            if (
                getattr(attr, _DECLARED_BY, None) is not None
                and name not in made
                and name not in own
            ):
                # Declared by an orchestration this class replaced: not one of its handlers.
                setattr(cls, name, None)
    for name, handler in made.items():
        if name not in own:
            setattr(cls, name, handler)


def declaration_problems(cls: type[StepMachine]) -> list[str]:
    """A reply or start event is declared once: by the orchestration or by a handler."""
    o = getattr(cls, "orchestration", None)
    if not isinstance(o, Orchestration):
        return []
    by_hand = _by_hand(cls)
    problems = []
    for event, _, _, where in _declarations(o):
        name = f"on_{event.__name__}"
        if event in by_hand:
            problems.append(
                f"{event.__name__} is declared twice, by {where} and by {by_hand[event]}; keep "
                "one (the declaration beside the step, or the handler)"
            )
        elif getattr(getattr(cls, name, None), _DECLARED_BY, None) is None:
            problems.append(
                f"{cls.__qualname__}.{name} is taken, but the handler {where} declares is "
                "kept under that name; rename the attribute"
            )
    return problems


def _start_handler(o: Orchestration) -> ReplyHandler:
    """The start handler: keep the event, then ``begin`` with the settings declared."""
    assert o.start is not None
    keys = o.settings
    settings: dict[str, Any] = {}
    # Parameter name -> (begin's argument, step); the saga deadline has no step.
    targets: dict[str, tuple[str, str | None]] = {}
    if keys.sla is not None:
        settings["sla"] = Annotated[timedelta, Setting(keys.sla, default=o.sla)]
        targets["sla"] = ("sla", None)
    for i, (what, name, key) in enumerate(keys.by_step()):
        step = o.step(name)
        default = {"timeouts": step.timeout, "retries": step.retry}.get(what, step.late_window)
        value_type = RetryPolicy if what == "retries" else timedelta
        settings[f"{what}_{i}"] = Annotated[value_type, Setting(key, default=default)]
        targets[f"{what}_{i}"] = (what, name)

    def apply(saga: Driven, event: Message, io: HandlerIo, **configured: Any) -> None:
        chosen: dict[str, dict[str, Any]] = {"timeouts": {}, "retries": {}, "late_windows": {}}
        sla = None
        for parameter, value in configured.items():
            what, step = targets[parameter]
            if step is None:
                sla = value
            else:
                chosen[what][step] = value
        saga.begin(event, io, sla=sla, **chosen)

    spelt = "Orchestration(start=...)"
    return build_handler(apply, o.start, None, start=True, settings=settings, spelling=spelt)


def keep_start(saga: StepMachine, event: Message) -> str:
    """Keep the start event on the state; return the saga id it carries.

    The event goes into every field of the saga typed with its class (``trip: BookTrip =
    start_event()``, or ``BookTrip | None``), and each of its fields into the saga's field of
    the same name, if the saga declares one (not the orchestrator's own ``machine`` and
    ``progress``).

    Raises:
        ValueError: The event carries no saga id in the saga's association property.
    """
    whole, same = _start_fields(type(saga), type(event))
    for name in whole:
        setattr(saga, name, event)
    for name in same:
        setattr(saga, name, getattr(event, name))
    key = definition_of(type(saga)).association_value(event)
    if key is None:
        raise ValueError(f"{type(event).__name__} carries no saga id to begin with")
    return key


@functools.cache
def _start_fields(
    saga_cls: type[StepMachine], event_cls: type[Message]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    whole, same = [], []
    for name, info in saga_cls.model_fields.items():
        if name in StepMachine.model_fields:
            continue
        annotation = info.annotation
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            rest = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = rest[0] if len(rest) == 1 else annotation
        if annotation is event_cls:
            whole.append(name)
        elif name in event_cls.model_fields:
            same.append(name)
    return tuple(whole), tuple(same)
