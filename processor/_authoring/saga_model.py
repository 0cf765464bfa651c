"""What a saga class is once declared: its state base, its handlers, and the check of the whole.

:mod:`processor._authoring.definition` holds the decorators authors write; they mark functions with
:class:`Mark` and call :func:`build` from ``@saga``, which inspects the class once and raises a
single :class:`SagaDefinitionError` listing every problem.
"""

from __future__ import annotations

import builtins
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from processor._authoring.marks import SAGA, attached, foreign_handlers, keep_one
from processor._authoring.messages import Message
from processor._authoring.params import Param, classify_params
from processor._errors import SagaDefinitionError

__all__ = [
    "DEFINITION",
    "MARK",
    "HandlerDef",
    "Mark",
    "SagaDefinition",
    "SagaState",
    "build",
    "definition_of",
    "handled_event",
]

MARK = "__saga_handler_marks__"
DEFINITION = "__saga_definition__"


class SagaState(BaseModel):
    """Base class of saga classes; the model's fields are the saga's durable state.

    The runner validates the whole state once after each handler, so a handler cannot store a
    value the state cannot load back (one validation per handler is far cheaper than one per
    assignment on the hot path). Unknown fields are rejected at assignment so a typo does not
    silently become lost state.
    """

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def definition_problems(cls) -> list[str]:
        """Problems a base class finds in how a subclass wires itself; ``@saga`` reports them.

        Base classes that give sagas a structure of their own (the state-machine
        orchestrator) override this, so a handler that names a step that does not exist fails
        at import with every other problem rather than parking sagas at runtime.
        """
        return []


@dataclass(frozen=True)
class Mark:
    kind: Literal["event", "deadline"]
    key: object  # event class (or None to infer) / deadline name, validated by @saga
    association_property: object
    start: bool
    end: bool


@dataclass(frozen=True)
class HandlerDef:
    """A validated handler.

    Attributes:
        name: Function name.
        kind: ``"event"`` or ``"deadline"``.
        key: The event class, or the deadline name.
        func: The undecorated function; call it as ``func(state, **kwargs)``.
        params: Resolved parameters, excluding ``self``.
        association_property: Event field holding the saga id (event handlers only).
        start: Whether the handler may create a new saga instance.
        end: Whether the saga ends after the handler runs.
    """

    name: str
    kind: Literal["event", "deadline"]
    key: type[Message] | str
    func: Callable[..., Any]
    params: tuple[Param, ...]
    association_property: str | None
    start: bool
    end: bool


@dataclass(frozen=True)
class SagaDefinition:
    """Everything the runtime needs to know about one saga class.

    Attributes:
        saga_type: The saga's type name, stored with every instance.
        state_cls: The saga class.
        event_handlers: Handler per event class.
        deadline_handlers: Handler per deadline name.
        state_version: Version of the state's JSON shape; stored with each row, so upcasters
            can bring older rows up to it on load.
    """

    saga_type: str
    state_cls: type[SagaState]
    event_handlers: Mapping[type[Message], HandlerDef]
    deadline_handlers: Mapping[str, HandlerDef]
    state_version: int = 1

    def handles(self, event_cls: type[Message]) -> bool:
        """Return whether the saga has a handler for ``event_cls``."""
        return event_cls in self.event_handlers

    def association_value(self, event: Message) -> str | None:
        """Return the saga id carried by ``event``.

        Returns:
            ``str()`` of the handler's association property, or None when the saga does not
            handle the event or the value is missing, None or empty.
        """
        handler = self.event_handlers.get(type(event))
        if handler is None or handler.association_property is None:
            return None
        value = getattr(event, handler.association_property, None)
        if value is None:
            return None
        text = str(value)
        return text or None

    @property
    def handlers(self) -> tuple[HandlerDef, ...]:
        """Every handler, event handlers first."""
        return (*self.event_handlers.values(), *self.deadline_handlers.values())


def definition_of(cls: type[SagaState]) -> SagaDefinition:
    """Return the definition attached by :func:`saga`.

    Raises:
        SagaDefinitionError: ``cls`` is not decorated with ``@saga``.
    """
    refusal = "is not a saga; decorate it with @saga(type=...)"
    return attached(cls, DEFINITION, SagaDefinition, refusal)


def build(
    cls: object,
    type_arg: str | None,
    alias: str | None,
    version: object = 1,
    association_property: object = None,
) -> SagaDefinition:
    problems: list[str] = []
    if association_property is not None and (
        not isinstance(association_property, str) or not association_property
    ):
        problems.append(
            f"association_property={association_property!r} must name the event field holding "
            "the saga id"
        )
        association_property = None
    state_version = 1
    if isinstance(version, int) and not isinstance(version, bool) and version >= 1:
        state_version = version
    else:
        problems.append(f"the state version must be an integer >= 1, got {version!r}")
    name = getattr(cls, "__qualname__", repr(cls))
    if type_arg is not None and alias is not None and type_arg != alias:
        problems.append("pass the saga type once: either type= or saga_type=")
    saga_type = type_arg if type_arg is not None else alias
    if not isinstance(saga_type, str) or not saga_type.strip():
        problems.append("give the saga a non-empty type name: @saga(type='my-saga')")
        saga_type = ""
    # ``saga`` shadows the builtin ``type`` in its signature, hence ``builtins.type``.
    foreign = foreign_handlers(cls, SAGA) if isinstance(cls, builtins.type) else []
    problems.extend(foreign)
    if not (isinstance(cls, builtins.type) and issubclass(cls, SagaState)):
        problems.append(f"{name} must subclass processor.SagaState (its fields are the state)")
        raise SagaDefinitionError(problems, subject=f"saga {name}")

    for field_name, info in cls.model_fields.items():
        if info.is_required():
            problems.append(
                f"field {field_name!r} needs a default: a new instance is created when the "
                "start event arrives"
            )

    event_handlers: dict[type[Message], HandlerDef] = {}
    deadline_handlers: dict[str, HandlerDef] = {}
    localns = {cls.__name__: cls}
    marked = _marked_functions(cls)
    # Counted over the marks, not the valid handlers, so a broken start handler is reported
    # once for what is wrong with it rather than again as "no start handler".
    declares_start = False
    for func in marked:
        marks: tuple[Mark, ...] = getattr(func, MARK)
        declares_start = declares_start or any(m.start for m in marks)
        if len(marks) > 1:
            problems.append(
                f"handler {func.__qualname__} carries {len(marks)} handler decorators; use one"
            )
            continue
        handler = _handler(func, marks[0], localns, problems, association_property)
        if handler is None:
            continue
        if isinstance(handler.key, str):
            what = f"deadline {handler.key!r}"
            keep_one(deadline_handlers, handler.key, handler, what, problems)
        else:
            what = f"event {handler.key.__qualname__}"
            keep_one(event_handlers, handler.key, handler, what, problems)

    # A class of command handlers only is a participant under the wrong decorator: saying it
    # lacks a start handler too would point the author the wrong way.
    if not declares_start and not (foreign and not marked):
        problems.append(
            "no start handler: mark at least one event handler with "
            "@saga_event_handler(..., start=True)"
        )
    problems.extend(cls.definition_problems())
    if problems:
        raise SagaDefinitionError(problems, subject=f"saga {name}")
    return SagaDefinition(
        saga_type=saga_type,
        state_cls=cls,
        event_handlers=MappingProxyType(event_handlers),
        deadline_handlers=MappingProxyType(deadline_handlers),
        state_version=state_version,
    )


def handled_event(func: object) -> type[Message] | None:
    """The event class ``func`` is marked to handle, or None if it is no event handler.

    Read from its decorator, else from the parameter annotated with a message class; None
    when neither says (``@saga`` then reports the handler).
    """
    for mark in getattr(func, MARK, ()):
        if mark.kind != "event":
            continue
        if isinstance(mark.key, type) and issubclass(mark.key, Message):
            return mark.key
        try:
            hints = typing.get_type_hints(func)
        except Exception:
            return None
        found = [
            t
            for name, t in hints.items()
            if name != "return" and isinstance(t, type) and issubclass(t, Message)
        ]
        return found[0] if len(found) == 1 else None
    return None


def _marked_functions(cls: type) -> list[Callable[..., Any]]:
    # Walk the MRO base-first so an override in a subclass replaces the inherited handler.
    found: dict[str, Callable[..., Any]] = {}
    for klass in reversed(cls.__mro__):
        for attr_name, attr in vars(klass).items():
            if callable(attr) and getattr(attr, MARK, None):
                found[attr_name] = attr
            else:
                found.pop(attr_name, None)
    return list(found.values())


def _handler(
    func: Callable[..., Any],
    mark: Mark,
    localns: dict[str, Any],
    problems: list[str],
    saga_property: object = None,
) -> HandlerDef | None:
    where = f"handler {func.__qualname__}"
    if inspect.iscoroutinefunction(func) or inspect.isgeneratorfunction(func):
        problems.append(f"{where}: handlers are plain synchronous functions that do no I/O")
    event_type: type[Message] | None = None
    prop: object = None
    if mark.kind == "event":
        key = mark.key
        if key is not None:
            if isinstance(key, type) and issubclass(key, Message):
                event_type = key
            else:
                problems.append(f"{where}: the event type {key!r} must be a Message subclass")
        prop = mark.association_property
        inherited = prop is None and saga_property is not None
        if inherited:
            prop = saga_property
        if prop is None:
            problems.append(
                f"{where}: association_property must name a field of the event; pass it here, "
                "or once for the saga: @saga(type=..., association_property='...')"
            )
        elif not isinstance(prop, str) or not prop:
            problems.append(f"{where}: association_property must name a field of the event")
    elif not isinstance(mark.key, str) or not mark.key.strip():
        problems.append(f"{where}: the deadline name must be a non-empty string")

    params, event_type = classify_params(
        func, kind=mark.kind, event_type=event_type, localns=localns, problems=problems
    )
    if (
        mark.kind == "event"
        and event_type is not None
        and isinstance(prop, str)
        and prop
        and prop not in event_type.model_fields
    ):
        fields = ", ".join(event_type.model_fields) or "none"
        said = " (the saga's, from @saga(association_property=...))" if inherited else ""
        problems.append(
            f"{where}: association_property {prop!r}{said} is not a field of "
            f"{event_type.__qualname__} (fields: {fields}); add it to the event, or name "
            "the field that holds the saga id"
        )
    # A handler with problems is still returned when its key is known, so that duplicates are
    # reported too; the caller raises because ``problems`` is not empty.
    if mark.kind == "event":
        if event_type is None:
            return None
        return HandlerDef(
            func.__name__, "event", event_type, func, params, str(prop), mark.start, mark.end
        )
    if not isinstance(mark.key, str):
        return None
    return HandlerDef(func.__name__, "deadline", mark.key, func, params, None, False, mark.end)
