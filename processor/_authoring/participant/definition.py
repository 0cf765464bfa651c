"""Participant declaration: command handlers by command type, validated at import time.

A participant is a plain class whose methods handle commands. Parameters are asked for by type,
exactly as in saga handlers (:mod:`processor._authoring.params` classifies them): the command, its
:class:`~processor._authoring.messages.MessageMetadata`, :class:`Replies`, the service's
:class:`Sql` connection, settings (``Annotated[T, Setting(...)]``) and registered dependencies.

Example:
    >>> @participant(name="inventory")  # doctest: +SKIP
    ... class Inventory:
    ...     @command_handler(expired=lambda c: StockUnavailable(order_id=c.order_id,
    ...                                                         reason="expired"))
    ...     def reserve(self, command: ReserveStock, replies: Replies, sql: Sql) -> None:
    ...         sql.execute("UPDATE stock SET held = held + %s WHERE sku = %s", ...)
    ...         replies.send(StockReserved(order_id=command.order_id))
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, NoReturn, TypeVar, overload

from processor._authoring.choices import choice_problem
from processor._authoring.definition import HandlerDef
from processor._authoring.marks import (
    PARTICIPANT,
    attached,
    foreign_handlers,
    keep_one,
    tag,
    used_bare,
)
from processor._authoring.messages import Message
from processor._authoring.params import Param, classify_params
from processor._authoring.participant.handles import Bucket, Replies
from processor._errors import SagaDefinitionError
from processor._ports.participant import Sql

__all__ = [
    "DROP",
    "CommandHandlerDef",
    "Expired",
    "ParticipantDefinition",
    "command_handler",
    "participant",
    "participant_of",
]

_MARK = "__participant_handler_mark__"
_DEFINITION = "__participant_definition__"

Drop = Literal["drop"]
DROP: Drop = "drop"
"""Declares that a command past its ``deadline-unix-ms`` is dropped without a reply."""

Expired = Callable[[Any], Message] | Drop
"""What to do with an expired command: build the reply from the command, or :data:`DROP`."""

_F = TypeVar("_F", bound=Callable[..., Any])
_C = TypeVar("_C", bound=type)

# Parameters the kit injects per command; anything else unknown is a registered dependency.
_KIT_HANDLES: dict[type, str] = {Replies: "replies", Sql: "sql", Bucket: "bucket"}
_SAGA_ONLY = ("commands", "deadlines", "lifecycle", "handles")


@dataclass(frozen=True)
class _Mark:
    command_type: object
    expired: object


@dataclass(frozen=True)
class CommandHandlerDef:
    """A validated command handler.

    Attributes:
        name: Function name.
        command_type: The command class it handles.
        func: The undecorated function; call it as ``func(instance, **kwargs)``.
        params: Parameters resolved by the binder (settings, dependencies, command, metadata).
        kit_params: Parameter name per kit handle (``replies``, ``sql``, ``bucket``).
        expired: The declared treatment of an expired command.
    """

    name: str
    command_type: type[Message]
    func: Callable[..., Any]
    params: tuple[Param, ...]
    kit_params: Mapping[str, str]
    expired: Expired

    def as_handler(self) -> HandlerDef:
        """The saga-shaped view :func:`processor._authoring.binding.resolve_handler` resolves."""
        return HandlerDef(
            self.name, "event", self.command_type, self.func, self.params, None, False, False
        )


@dataclass(frozen=True)
class ParticipantDefinition:
    """Everything the kit needs to know about one participant class.

    Attributes:
        name: The participant's name (default consumer group and log name).
        cls: The participant class; the kit creates one instance.
        handlers: Handler per command class.
    """

    name: str
    cls: type
    handlers: Mapping[type[Message], CommandHandlerDef]


@overload
def command_handler(
    command_type: type[Message] | None = None, *, expired: Expired = DROP
) -> Callable[[_F], _F]: ...
@overload
def command_handler(command_type: _F, /) -> _F: ...
def command_handler(command_type: Any = None, *, expired: Expired = DROP) -> Any:
    """Mark a participant method as the handler of one command type.

    Written bare (``@command_handler``) it reads the command type from the annotated parameter
    and drops expired commands, as ``@command_handler()`` does.

    Args:
        command_type: The command class; inferred from the one Message-annotated parameter
            when omitted.
        expired: For a command whose ``deadline-unix-ms`` has passed, which is never run: a
            function from the command to the reply to send instead, or :data:`DROP`.

    Returns:
        The decorator (or, used bare, the marked method).
    """

    def decorate(func: _F) -> _F:
        if not inspect.isfunction(func):
            raise SagaDefinitionError(["@command_handler applies to plain methods"])
        # Every mark is kept, so two decorators on one method are reported, not one dropped.
        setattr(func, _MARK, (*getattr(func, _MARK, ()), _Mark(command_type, expired)))
        tag(func, PARTICIPANT, "@command_handler")
        return func

    # A callable that is not a class is the method itself: the decorator was written bare.
    if callable(command_type) and not isinstance(command_type, type):
        return command_handler(expired=expired)(command_type)
    return decorate


@overload
def participant(*, name: str) -> Callable[[_C], _C]: ...
@overload
def participant(cls: type, /) -> NoReturn: ...
def participant(cls: type | None = None, /, *, name: Any = None) -> Any:
    """Class decorator declaring a participant.

    Args:
        cls: Only set when the decorator is written bare, which is refused.
        name: The participant's name.

    Returns:
        The decorator. It validates every handler and raises one :class:`SagaDefinitionError`
        listing every problem, or attaches a :class:`ParticipantDefinition`.

    Raises:
        SagaDefinitionError: Used bare (``@participant``): the name is the participant's
            consumer group, so it is written out rather than guessed from the class name.
    """
    if cls is not None:
        raise used_bare("participant", cls, "@participant(name='inventory')")

    def decorate(klass: _C) -> _C:
        setattr(klass, _DEFINITION, _build(klass, name))
        return klass

    return decorate


def participant_of(cls: type) -> ParticipantDefinition:
    """Return the definition attached by :func:`participant`.

    Raises:
        SagaDefinitionError: ``cls`` is not decorated with ``@participant``.
    """
    refusal = "is not a participant; decorate it with @participant"
    return attached(cls, _DEFINITION, ParticipantDefinition, refusal)


def _build(cls: type, name: str) -> ParticipantDefinition:
    problems: list[str] = []
    if not isinstance(name, str) or not name.strip():
        problems.append("give the participant a non-empty name: @participant(name='inventory')")
    problems.extend(foreign_handlers(cls, PARTICIPANT))
    handlers: dict[type[Message], CommandHandlerDef] = {}
    for attr in vars(cls).values():
        marks = getattr(attr, _MARK, None)
        if not isinstance(marks, tuple) or not marks:
            continue
        if len(marks) > 1:
            problems.append(
                f"handler {attr.__qualname__} carries {len(marks)} @command_handler decorators; "
                "one method handles one command type"
            )
            continue
        handler = _handler(attr, marks[0], {cls.__name__: cls}, problems)
        if handler is None:
            continue
        what = f"command {handler.command_type.__qualname__}"
        keep_one(handlers, handler.command_type, handler, what, problems)
    if not handlers and not problems:
        problems.append("no command handler: mark a method with @command_handler")
    if problems:
        raise SagaDefinitionError(problems, subject=f"participant {cls.__qualname__}")
    return ParticipantDefinition(name, cls, MappingProxyType(handlers))


def _handler(
    func: Callable[..., Any], mark: _Mark, localns: dict[str, Any], problems: list[str]
) -> CommandHandlerDef | None:
    where = f"handler {func.__qualname__}"
    if inspect.iscoroutinefunction(func) or inspect.isgeneratorfunction(func):
        problems.append(f"{where}: handlers are plain synchronous functions")
    given: type[Message] | None = None
    if mark.command_type is not None:
        if isinstance(mark.command_type, type) and issubclass(mark.command_type, Message):
            given = mark.command_type
        else:
            problems.append(f"{where}: the command type {mark.command_type!r} is not a Message")
    if isinstance(mark.expired, str):
        wrong = choice_problem("expired", mark.expired, Drop)
        if wrong is not None:
            problems.append(f"{where}: {wrong} (or pass a function building the reply)")
    elif not callable(mark.expired):
        problems.append(
            f"{where}: expired={mark.expired!r}: pass a function building the reply, or DROP"
        )
    params, command_type = classify_params(
        func, kind="event", event_type=given, localns=localns, problems=problems
    )
    kept: list[Param] = []
    kit: dict[str, str] = {}
    for p in params:
        handle = _KIT_HANDLES.get(p.annotation) if p.kind == "dependency" else None
        if handle is not None:
            kit[p.name] = handle
        elif p.kind in _SAGA_ONLY:
            problems.append(
                f"{where}: parameter {p.name!r} asks for {p.annotation.__qualname__}, a saga "
                "handle; a participant answers with Replies"
            )
        else:
            kept.append(p)
    if command_type is None:
        return None
    expired: Expired = mark.expired if callable(mark.expired) else DROP
    return CommandHandlerDef(
        func.__name__, command_type, func, tuple(kept), MappingProxyType(kit), expired
    )
