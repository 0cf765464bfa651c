"""Message base class and the message-type registry (header names live in `wire`).

Events and commands are frozen pydantic models registered under a stable dotted name and a
version. The name and version travel in Kafka headers, so a consumer in any language can pick the
right schema without inspecting the payload.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from processor._errors import SagaDefinitionError, UnknownMessageType
from processor._wire import (
    HEADER_CAUSATION_ID,
    HEADER_CORRELATION_ID,
    HEADER_DEADLINE_UNIX_MS,
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_OCCURRED_AT,
    HEADER_SAGA_ID,
    HEADER_SAGA_TYPE,
    HEADER_SCHEMA_VERSION,
)

__all__ = [
    "HEADER_CAUSATION_ID",
    "HEADER_CORRELATION_ID",
    "HEADER_DEADLINE_UNIX_MS",
    "HEADER_MESSAGE_ID",
    "HEADER_MESSAGE_TYPE",
    "HEADER_OCCURRED_AT",
    "HEADER_SAGA_ID",
    "HEADER_SAGA_TYPE",
    "HEADER_SCHEMA_VERSION",
    "Message",
    "MessageMetadata",
    "MessageRegistry",
    "MessageType",
    "message_type",
    "registry",
]


class Message(BaseModel):
    """Base class of every event and command.

    Messages are immutable facts or requests: frozen, and unknown fields are rejected so a typo
    in a producer fails loudly instead of being silently dropped.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True)
class MessageType:
    """A registered message class and where it lives on the wire.

    Attributes:
        name: Stable dotted name sent in the ``message-type`` header.
        version: Schema version sent in the ``schema-version`` header.
        cls: The pydantic model class.
        topic: Default topic commands of this type are sent to, if any.
    """

    name: str
    version: int
    cls: type[Message]
    topic: str | None


class MessageRegistry:
    """Maps wire names and versions to message classes and back."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, int], MessageType] = {}
        self._by_cls: dict[type[Message], MessageType] = {}
        self._upcasters: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}

    def register(
        self, cls: type[Message], name: str, version: int = 1, topic: str | None = None
    ) -> MessageType:
        """Register ``cls`` under ``name`` and ``version``.

        Registering the same class again with identical arguments returns the existing entry, so
        re-importing a module is harmless.

        Args:
            cls: A subclass of :class:`Message`.
            name: Stable wire name, e.g. ``"transfers.DebitAccount"``.
            version: Schema version, starting at 1.
            topic: Default topic for commands of this type.

        Returns:
            The registered :class:`MessageType`.

        Raises:
            SagaDefinitionError: The class is not a Message, the arguments are invalid, the
                (name, version) pair is taken by another class, or the class is already
                registered differently.
        """
        problems: list[str] = []
        if not (isinstance(cls, type) and issubclass(cls, Message)):
            problems.append(f"{cls!r} must subclass processor.Message to be registered")
        if not name or name != name.strip():
            problems.append(f"message type name {name!r} must be non-empty without spaces")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            problems.append(f"version of {name!r} must be an integer >= 1, got {version!r}")
        if topic is not None and not topic:
            problems.append(f"default topic of {name!r} must be non-empty or None")
        if problems:
            raise SagaDefinitionError(problems)

        entry = MessageType(name=name, version=version, cls=cls, topic=topic)
        existing = self._by_cls.get(cls)
        if existing is not None:
            if existing == entry:
                return existing
            raise SagaDefinitionError(
                [
                    f"{cls.__qualname__} is already registered as {existing.name!r} "
                    f"v{existing.version}; register each class once, declare a new class for "
                    "a new version"
                ]
            )
        taken = self._by_key.get((name, version))
        if taken is not None:
            raise SagaDefinitionError(
                [
                    f"message type {name!r} v{version} is already registered by "
                    f"{taken.cls.__module__}.{taken.cls.__qualname__}; pick another name or "
                    "bump the version"
                ]
            )
        self._by_key[(name, version)] = entry
        self._by_cls[cls] = entry
        return entry

    def by_name(self, name: str, version: int | None = None) -> MessageType:
        """Look up a message type by wire name.

        Args:
            name: The wire name.
            version: The schema version; None selects the latest registered version.

        Raises:
            UnknownMessageType: Nothing is registered under that name (and version).
        """
        if version is not None:
            entry = self._by_key.get((name, version))
            if entry is None:
                raise UnknownMessageType(f"no message type {name!r} v{version} is registered")
            return entry
        versions = [e for (n, _), e in self._by_key.items() if n == name]
        if not versions:
            raise UnknownMessageType(f"no message type {name!r} is registered")
        return max(versions, key=lambda e: e.version)

    def add_upcaster(
        self, name: str, from_version: int, func: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> None:
        """Register ``func`` to turn a ``name`` payload at ``from_version`` into the next one.

        Raises:
            SagaDefinitionError: Invalid arguments, or another function holds the slot.
        """
        problems: list[str] = []
        if not name or name != name.strip():
            problems.append(f"message type name {name!r} must be non-empty without spaces")
        if isinstance(from_version, bool) or not isinstance(from_version, int) or from_version < 1:
            problems.append(f"from_version must be an integer >= 1, got {from_version!r}")
        taken = self._upcasters.get((name, from_version))
        if taken is not None and taken is not func:
            problems.append(f"message type {name!r} already has an upcaster from v{from_version}")
        if problems:
            raise SagaDefinitionError(problems, subject="event upcaster")
        self._upcasters[(name, from_version)] = func

    def newest_version(self, name: str) -> int | None:
        """The highest version registered under ``name``, or None when the name is unknown."""
        versions = [v for n, v in self._by_key if n == name]
        return max(versions) if versions else None

    def upcast_path(
        self, name: str, version: int
    ) -> tuple[MessageType, list[Callable[[dict[str, Any]], dict[str, Any]]]] | None:
        """The upcasters from ``version`` to the first registered version they reach.

        Returns:
            The target registration and the functions to apply in order, or None when no
            chain of upcasters leads from ``version`` to a registered version.
        """
        chain: list[Callable[[dict[str, Any]], dict[str, Any]]] = []
        v = version
        while (name, v) not in self._by_key:
            func = self._upcasters.get((name, v))
            if func is None:
                return None
            chain.append(func)
            v += 1
        return self._by_key[(name, v)], chain

    def of(self, cls: type[Message]) -> MessageType:
        """Return the registration of ``cls``.

        Raises:
            UnknownMessageType: ``cls`` was never registered.
        """
        entry = self._by_cls.get(cls)
        if entry is None:
            raise UnknownMessageType(
                f"{getattr(cls, '__qualname__', cls)!r} is not registered; decorate it with "
                "@message_type(...)"
            )
        return entry

    def all(self) -> list[MessageType]:
        """Return every registration, sorted by name then version."""
        return sorted(self._by_key.values(), key=lambda e: (e.name, e.version))

    def __contains__(self, item: object) -> bool:
        """Return whether a class (or a wire name) is registered."""
        if isinstance(item, str):
            return any(n == item for n, _ in self._by_key)
        return item in self._by_cls

    def __len__(self) -> int:
        return len(self._by_key)


registry = MessageRegistry()
"""The default registry used by :func:`message_type` and the processor."""

_M = TypeVar("_M", bound=type[Message])


def message_type(
    name: str, *, version: int = 1, topic: str | None = None, registry: MessageRegistry = registry
) -> Callable[[_M], _M]:
    """Class decorator registering a :class:`Message` subclass.

    Example:
        >>> @message_type("billing.ChargeCard", topic="billing-commands")  # doctest: +SKIP
        ... class ChargeCard(Message):
        ...     order_id: str

    Args:
        name: Stable wire name.
        version: Schema version, starting at 1.
        topic: Default topic commands of this type are sent to.
        registry: Registry to use; the default one when omitted.

    Returns:
        The decorator, which returns the class unchanged.
    """

    def decorate(cls: _M) -> _M:
        registry.register(cls, name, version=version, topic=topic)
        return cls

    return decorate


@dataclass(frozen=True)
class MessageMetadata:
    """Where an event came from; an event handler may declare a parameter of this type.

    Attributes:
        message_id: The ``message-id`` header.
        message_type: The ``message-type`` header.
        correlation_id: The ``correlation-id`` header, if present.
        causation_id: The ``causation-id`` header, if present.
        occurred_at: The ``occurred-at`` header parsed as a datetime, if present.
        topic: Source topic.
        partition: Source partition.
        offset: Source offset.
        key: Record key decoded as UTF-8, if any.
        headers: Every header, decoded as UTF-8.
    """

    message_id: str
    message_type: str
    correlation_id: str | None
    causation_id: str | None
    occurred_at: datetime | None
    topic: str
    partition: int
    offset: int
    key: str | None
    headers: Mapping[str, str] = field(default_factory=dict)
