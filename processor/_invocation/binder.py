"""Binding saga definitions at startup.

Every setting and dependency a handler asks for is resolved, and every problem of every saga is
reported in one error, so a misconfigured process stops before it consumes anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from processor._authoring.binding import ResolvedParam, resolve_handler
from processor._authoring.definition import SagaDefinition, SagaState, definition_of
from processor._authoring.messages import MessageRegistry, registry
from processor._authoring.upcasting import StateUpcasters, state_upcasters
from processor._errors import ConfigurationError
from processor._invocation.bound import BoundSaga

__all__ = ["bind", "bind_all"]


def bind(
    definition: SagaDefinition | type[SagaState],
    *,
    settings: Mapping[str, Any] | None = None,
    dependencies: Mapping[type, object] | None = None,
    registry: MessageRegistry = registry,
    upcasters: StateUpcasters = state_upcasters,
) -> BoundSaga:
    """Resolve every setting and dependency the saga's handlers ask for.

    Args:
        definition: A saga definition, or a class decorated with ``@saga``.
        settings: Values by key; dotted keys are also looked up through nested mappings.
        dependencies: Objects by type, injected into parameters annotated with that type.
        registry: Registry the saga's events and commands are declared in.
        upcasters: Registry of the saga's state upcasters; its chain must be gap-free.

    Raises:
        ConfigurationError: Lists every missing or invalid setting and dependency.
    """
    if not isinstance(definition, SagaDefinition):
        definition = definition_of(definition)
    problems: list[str] = []
    resolved: dict[str, tuple[ResolvedParam, ...]] = {}
    for handler in definition.handlers:
        resolved[handler.name] = resolve_handler(
            handler, settings or {}, dependencies or {}, problems
        )
    for event_cls in definition.event_handlers:
        if event_cls not in registry:
            problems.append(
                f"event {event_cls.__qualname__} is not registered, so it can never be decoded; "
                "decorate it with @message_type(...)"
            )
    problems.extend(upcasters.problems(definition.saga_type, definition.state_version))
    if problems:
        raise ConfigurationError(problems, subject=f"saga {definition.saga_type!r}")
    return BoundSaga(definition, resolved, registry, upcasters)


def bind_all(
    definitions: Iterable[SagaDefinition | type[SagaState]],
    *,
    settings: Mapping[str, Any] | None = None,
    dependencies: Mapping[type, object] | None = None,
    registry: MessageRegistry = registry,
    upcasters: StateUpcasters = state_upcasters,
) -> dict[str, BoundSaga]:
    """Bind several sagas, reporting every problem of every saga in one error.

    Returns:
        Bound sagas by saga type.

    Raises:
        ConfigurationError: Any saga failed to bind, or two sagas share a type name.
    """
    problems: list[str] = []
    bound: dict[str, BoundSaga] = {}
    for item in definitions:
        definition = item if isinstance(item, SagaDefinition) else definition_of(item)
        if definition.saga_type in bound:
            other = bound[definition.saga_type].definition.state_cls.__qualname__
            problems.append(
                f"sagas {other} and {definition.state_cls.__qualname__} share the type "
                f"{definition.saga_type!r}; give each a unique type"
            )
            continue
        try:
            bound[definition.saga_type] = bind(
                definition,
                settings=settings,
                dependencies=dependencies,
                registry=registry,
                upcasters=upcasters,
            )
        except ConfigurationError as e:
            problems.extend(f"saga {definition.saga_type!r}: {p}" for p in e.problems)
    if problems:
        raise ConfigurationError(problems)
    return bound
