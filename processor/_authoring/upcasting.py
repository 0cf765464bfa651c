"""Upcasters: functions that turn an older stored saga state (as JSON) into the next version.

A saga class declares its state version with ``@saga(type=..., version=N)`` (default 1); each
stored row keeps the version it was written with. On load, the upcasters registered for the
saga type run in a chain, ``v -> v+1 -> ... -> N``, on the stored JSON before the state model
validates it; the row is written back at version N with the saga's next change.

Event upcasters (older producers' payloads) live beside the message types, in
:meth:`processor._authoring.messages.MessageRegistry.add_upcaster`; :func:`event_upcaster` registers
one.

Example:
    >>> @upcaster("transfer-saga", from_version=1)  # doctest: +SKIP
    ... def rename_amount(state: dict[str, Any]) -> dict[str, Any]:
    ...     state["amount_minor"] = state.pop("amount")
    ...     return state
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from processor._authoring.messages import MessageRegistry
from processor._authoring.messages import registry as default_messages
from processor._errors import SagaDefinitionError, SagaError

__all__ = [
    "MissingUpcaster",
    "StateUpcaster",
    "StateUpcasters",
    "event_upcaster",
    "state_upcasters",
    "upcaster",
]

StateUpcaster = Callable[[dict[str, Any]], dict[str, Any]]
"""Takes the JSON of a state at version ``v`` and returns the JSON at version ``v + 1``."""

_U = TypeVar("_U", bound=Callable[[dict[str, Any]], dict[str, Any]])


class MissingUpcaster(SagaError):
    """A stored state's version cannot be brought to the saga's current version.

    Attributes:
        saga_type: The saga type.
        stored: The version the row was written with.
        current: The version the code declares.
    """

    def __init__(self, saga_type: str, stored: int, current: int, missing: int | None) -> None:
        self.saga_type = saga_type
        self.stored = stored
        self.current = current
        if stored > current:
            text = (
                f"saga {saga_type!r}: stored state is v{stored}, newer than this code's "
                f"v{current}; deploy the code that wrote it (roll forward)"
            )
        else:
            text = (
                f"saga {saga_type!r}: stored state is v{stored} but the code is at v{current} "
                f"and has no upcaster from v{missing}; register "
                f"@upcaster({saga_type!r}, from_version={missing})"
            )
        super().__init__(text)


class StateUpcasters:
    """Upcaster functions by (saga type, from version)."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, int], StateUpcaster] = {}

    def add(self, saga_type: str, from_version: int, func: StateUpcaster) -> None:
        """Register ``func`` as the upcaster of ``saga_type`` from ``from_version``.

        Registering the same function again is harmless (a module imported twice).

        Raises:
            SagaDefinitionError: Invalid arguments, or another function is registered for the
                same saga type and version.
        """
        problems: list[str] = []
        if not isinstance(saga_type, str) or not saga_type.strip():
            problems.append("an upcaster needs the saga's type name")
        if isinstance(from_version, bool) or not isinstance(from_version, int) or from_version < 1:
            problems.append(f"from_version must be an integer >= 1, got {from_version!r}")
        if not callable(func):
            problems.append(f"upcaster {func!r} is not callable")
        taken = self._by_key.get((saga_type, from_version))
        if taken is not None and taken is not func:
            problems.append(
                f"saga {saga_type!r} already has an upcaster from v{from_version} "
                f"({getattr(taken, '__qualname__', taken)}); keep exactly one"
            )
        if problems:
            raise SagaDefinitionError(problems, subject="upcaster")
        self._by_key[(saga_type, from_version)] = func

    def remove(self, saga_type: str, from_version: int) -> None:
        """Forget the upcaster of ``saga_type`` from ``from_version``, if there is one.

        For a process that binds sagas of more than one code version in turn (a test playing an
        old and a new release): older code must not see its successor's upcasters.
        """
        self._by_key.pop((saga_type, from_version), None)

    def versions(self, saga_type: str) -> list[int]:
        """The from-versions registered for ``saga_type``, ascending."""
        return sorted(v for t, v in self._by_key if t == saga_type)

    def chain(self, saga_type: str, stored: int, current: int) -> list[StateUpcaster]:
        """The upcasters that bring a state from ``stored`` to ``current``, in order.

        Raises:
            MissingUpcaster: ``stored`` is newer than ``current``, or a step is missing.
        """
        if stored > current:
            raise MissingUpcaster(saga_type, stored, current, None)
        out: list[StateUpcaster] = []
        for v in range(stored, current):
            func = self._by_key.get((saga_type, v))
            if func is None:
                raise MissingUpcaster(saga_type, stored, current, v)
            out.append(func)
        return out

    def problems(self, saga_type: str, current: int) -> list[str]:
        """What is wrong with the chain of ``saga_type`` at version ``current``, statically.

        The chain may start at any version (old upcasters can be dropped once no row needs
        them, which `saga-processor check` verifies), but it must be gap-free and end at
        ``current - 1``.
        """
        versions = self.versions(saga_type)
        out = [
            f"upcaster from v{v} is at or past the saga's version v{current}"
            for v in versions
            if v >= current
        ]
        below = [v for v in versions if v < current]
        if below:
            gaps = [v for v in range(below[0], current) if v not in below]
            out.extend(
                f"no upcaster from v{v}: the chain from v{below[0]} to v{current} has a gap"
                for v in gaps
            )
        return out

    def apply(
        self, saga_type: str, data: Mapping[str, Any], stored: int, current: int
    ) -> Mapping[str, Any]:
        """``data`` brought from version ``stored`` to ``current``; the input is not changed.

        Raises:
            MissingUpcaster: No chain from ``stored`` to ``current``.
            Exception: Whatever an upcaster raised.
        """
        chain = self.chain(saga_type, stored, current)
        if not chain:
            return data
        out: dict[str, Any] = _copy(data)
        for func in chain:
            result = func(out)
            if not isinstance(result, dict):
                raise TypeError(
                    f"upcaster {getattr(func, '__qualname__', func)} returned "
                    f"{type(result).__name__}, not a dict"
                )
            out = result
        return out


def _copy(data: Mapping[str, Any]) -> dict[str, Any]:
    # Upcasters may mutate their argument; the stored row must stay as it was loaded (it is
    # written back untouched when the saga parks).
    return copy.deepcopy(dict(data))


state_upcasters = StateUpcasters()
"""The default registry used by :func:`upcaster` and the processor."""


def upcaster(
    saga: str | type[Any], *, from_version: int, registry: StateUpcasters = state_upcasters
) -> Callable[[_U], _U]:
    """Register a function that upgrades a saga's stored state by one version.

    The function takes the state's JSON (a dict, which it may change) at ``from_version`` and
    returns the JSON at ``from_version + 1``. It runs on load, before the state is validated, so
    it sees plain JSON values (strings for decimals and datetimes).

    Args:
        saga: The saga type name, or the saga class.
        from_version: The version the function upgrades from.
        registry: Registry to use; the default one when omitted.

    Returns:
        The decorator; it returns the function unchanged.
    """
    if isinstance(saga, str):
        saga_type = saga
    else:
        from processor._authoring.definition import definition_of

        saga_type = definition_of(saga).saga_type

    def decorate(func: _U) -> _U:
        registry.add(saga_type, from_version, func)
        return func

    return decorate


def event_upcaster(
    name: str, *, from_version: int, registry: MessageRegistry = default_messages
) -> Callable[[_U], _U]:
    """Register a function that upgrades an event's JSON payload by one schema version.

    Applied to incoming records whose ``schema-version`` header names a version the code has no
    class for, until a registered version is reached; the payload is then validated by that
    version's class.

    Args:
        name: The message type's wire name.
        from_version: The schema version the function upgrades from.
        registry: Message registry to use; the default one when omitted.

    Returns:
        The decorator; it returns the function unchanged.
    """

    def decorate(func: _U) -> _U:
        registry.add_upcaster(name, from_version, func)
        return func

    return decorate
