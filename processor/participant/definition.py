"""Participant declaration: command handlers by command type, validated at import time.

A participant is a plain class whose methods handle commands. Parameters are asked for by type,
exactly as in saga handlers (:mod:`processor.params` classifies them): the command, its
:class:`~processor.messages.MessageMetadata`, :class:`Replies`, the service's :class:`Sql`
connection, settings (``Annotated[T, Setting(...)]``) and registered dependencies.

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
from typing import Any, Literal, TypeVar

from processor.definition import HandlerDef
from processor.errors import SagaDefinitionError
from processor.messages import Message
from processor.params import Param, classify_params
from processor.participant.handles import Replies
from processor.ports.participant import Sql

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

DROP: Literal["drop"] = "drop"
"""Declares that a command past its ``deadline-unix-ms`` is dropped without a reply."""

Expired = Callable[[Any], Message] | Literal["drop"]
"""What to do with an expired command: build the reply from the command, or :data:`DROP`."""

_F = TypeVar("_F", bound=Callable[..., Any])
_C = TypeVar("_C", bound=type)

# Parameters the kit injects per command; anything else unknown is a registered dependency.
_KIT_HANDLES: dict[type, str] = {Replies: "replies", Sql: "sql"}
_SAGA_ONLY = ("commands", "deadlines", "lifecycle")


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
        kit_params: Parameter name per kit handle (``replies``, ``sql``).
        expired: The declared treatment of an expired command.
    """

    name: str
    command_type: type[Message]
    func: Callable[..., Any]
    params: tuple[Param, ...]
    kit_params: Mapping[str, str]
    expired: Expired

    def as_handler(self) -> HandlerDef:
        """The saga-shaped view that :func:`processor.binding.resolve_handler` resolves."""
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


def command_handler(
    command_type: type[Message] | None = None, *, expired: Expired = DROP
) -> Callable[[_F], _F]:
    """Mark a participant method as the handler of one command type.

    Args:
        command_type: The command class; inferred from the one Message-annotated parameter
            when omitted.
        expired: For a command whose ``deadline-unix-ms`` has passed, which is never run: a
            function from the command to the reply to send instead, or :data:`DROP`.

    Returns:
        The decorator; it returns the function unchanged apart from the mark.
    """

    def decorate(func: _F) -> _F:
        if not inspect.isfunction(func):
            raise SagaDefinitionError(["@command_handler applies to plain methods"])
        setattr(func, _MARK, _Mark(command_type, expired))
        return func

    return decorate


def participant(*, name: str) -> Callable[[_C], _C]:
    """Class decorator declaring a participant.

    Args:
        name: The participant's name.

    Returns:
        The decorator. It validates every handler and raises one :class:`SagaDefinitionError`
        listing every problem, or attaches a :class:`ParticipantDefinition`.
    """

    def decorate(cls: _C) -> _C:
        setattr(cls, _DEFINITION, _build(cls, name))
        return cls

    return decorate


def participant_of(cls: type) -> ParticipantDefinition:
    """Return the definition attached by :func:`participant`.

    Raises:
        SagaDefinitionError: ``cls`` is not decorated with ``@participant``.
    """
    definition = vars(cls).get(_DEFINITION) if isinstance(cls, type) else None
    if not isinstance(definition, ParticipantDefinition):
        raise SagaDefinitionError([f"{cls!r} is not a participant; decorate it with @participant"])
    return definition


def _build(cls: type, name: str) -> ParticipantDefinition:
    problems: list[str] = []
    if not isinstance(name, str) or not name.strip():
        problems.append("give the participant a non-empty name: @participant(name='inventory')")
    handlers: dict[type[Message], CommandHandlerDef] = {}
    for attr in vars(cls).values():
        mark = getattr(attr, _MARK, None)
        if not isinstance(mark, _Mark):
            continue
        handler = _handler(attr, mark, {cls.__name__: cls}, problems)
        if handler is None:
            continue
        other = handlers.get(handler.command_type)
        if other is not None:
            problems.append(
                f"command {handler.command_type.__qualname__} has two handlers ({other.name}, "
                f"{handler.name}); keep exactly one"
            )
        handlers.setdefault(handler.command_type, handler)
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
    if not (mark.expired == DROP or callable(mark.expired)):
        problems.append(f"{where}: expired= takes a function building the reply, or DROP")
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
