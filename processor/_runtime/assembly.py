"""Builds what a processor runs from its settings: saga classes, bound sagas, the relay.

The processor and the operator commands both assemble through here, so an operator's retry of a
parked saga plans with the very sagas and planner that the consumer runs. `load_app` finds the
application object (`MODULE:ATTR`) that every command taking a target loads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# load_app and app_target live with SagaApp (no database driver, for the offline commands) and
# are offered here too, next to the other assembly steps every command calls.
from processor._authoring.application import (
    APP_VARIABLE,
    SagaApp,
    app_target,
    import_module,
    load_app,
)
from processor._authoring.definition import definition_of
from processor._authoring.messages import MessageRegistry
from processor._authoring.messages import registry as default_registry
from processor._engine.handlers import HandlerSpan
from processor._engine.plan import Planner
from processor._errors import ConfigurationError
from processor._invocation import BoundSaga, bind_all
from processor._observe.tracing import Tracing
from processor._ports.consumer import TP, RecordProducer
from processor._ports.outbox import OutboxStore
from processor._runtime.hooks import Hooks
from processor._runtime.relay import Relay
from processor._wire import Topics
from processor.settings import ProcessorSettings, RelaySettings

__all__ = [
    "APP_VARIABLE",
    "BoundSagas",
    "app_target",
    "bind_sagas",
    "input_topics",
    "load_app",
    "load_saga_classes",
    "open_sagas",
    "operator_key",
    "relay_for",
]


def load_saga_classes(specs: Iterable[str]) -> list[type[Any]]:
    """`module:Class`, or a module exposing `SAGAS` (or `EXAMPLE_SAGAS`), as `SAGA_SAGAS` lists.

    Modules are found as `saga-processor diagram` finds them (the working directory too).

    Raises:
        ConfigurationError: Naming every entry that does not load, and how to fix it.
    """
    found: list[type[Any]] = []
    problems: list[str] = []
    for spec in specs:
        module_name, _, attr = spec.partition(":")
        try:
            module = import_module(module_name)
            if attr:
                found.append(getattr(module, attr))
                continue
        except (ImportError, AttributeError) as e:
            problems.append(f"SAGA_SAGAS: cannot load {spec!r}: {type(e).__name__}: {e}")
            continue
        listed: Iterable[type[Any]] | None = getattr(module, "SAGAS", None) or getattr(
            module, "EXAMPLE_SAGAS", None
        )
        if not listed:
            problems.append(
                f"SAGA_SAGAS: module {module_name!r} has no SAGAS list: name a class "
                f"({module_name}:MySaga) or define SAGAS = [MySaga] in it"
            )
            continue
        found.extend(listed)
    if problems:
        raise ConfigurationError(problems)
    return found


def operator_key(settings: ProcessorSettings) -> bytes | None:
    """The key that signs operator records, or None when none is configured."""
    key = settings.operator.key
    return key.get_secret_value().encode() if key is not None else None


def relay_for(
    outbox: OutboxStore,
    producer: RecordProducer,
    settings: RelaySettings,
    *,
    hooks: Hooks | None = None,
    owned: Callable[[], Mapping[TP, int]] | None = None,
    drain_on_stop: threading.Event | None = None,
    tracing: Tracing | None = None,
) -> Relay:
    """The outbox relay over ``outbox``, its batches, waits and attempts as ``settings`` say.

    The processor's relay and a service's (participant service, outbox relay) are made here
    alike; only the processor's publishes the rows of the partitions it ``owned``.
    """
    return Relay(
        outbox,
        producer,
        batch_size=settings.batch_size,
        max_batch_bytes=settings.max_batch_bytes,
        poll_interval=settings.poll_interval.total_seconds(),
        flush_timeout=settings.flush_timeout.total_seconds(),
        max_attempts=settings.max_attempts,
        max_record_bytes=settings.max_record_bytes,
        hooks=hooks,
        owned=owned,
        drain_on_stop=drain_on_stop,
        tracing=tracing,
    )


@dataclass(frozen=True, slots=True)
class BoundSagas:
    """The sagas a processor runs, with the message types and the planner over them.

    Attributes:
        sagas: Bound sagas by saga type name.
        registry: Message types, to decode records and name topics.
        planner: Routes decoded records to `sagas` and plans each batch's writes.
    """

    sagas: dict[str, BoundSaga]
    registry: MessageRegistry
    planner: Planner


def bind_sagas(
    settings: ProcessorSettings,
    saga_classes: Iterable[type[Any]] | None = None,
    *,
    dependencies: Mapping[type, object] | None = None,
    registry: MessageRegistry = default_registry,
    handler_span: HandlerSpan | None = None,
) -> BoundSagas:
    """Binds the saga classes to the settings and builds the planner a processor runs.

    Args:
        settings: The processor's settings.
        saga_classes: Saga classes; None loads `settings.sagas`.
        dependencies: Objects the sagas' handlers ask for.
        registry: Message types.
        handler_span: Wraps each handler call (a span); None: none.

    Raises:
        ConfigurationError: `saga_classes` is None and `settings.sagas` names no saga.
    """
    if saga_classes is None:
        if not settings.sagas:
            raise ConfigurationError(
                [
                    "no saga configured: name the application object "
                    "(saga-processor run myapp.service:app, or SAGA_APP=myapp.service:app), "
                    "or list the sagas, e.g. SAGA_SAGAS='[\"myapp.sagas:TransferSaga\"]'"
                ]
            )
        saga_classes = load_saga_classes(settings.sagas)
        if not saga_classes:
            raise ConfigurationError(
                [f"SAGA_SAGAS: {settings.sagas} names no saga class (no SAGAS list found)"]
            )
    classes = list(saga_classes)
    sagas = bind_all(
        [definition_of(c) for c in classes],
        settings=settings.settings,
        dependencies=dependencies or {},
        registry=registry,
    )
    planner = Planner(
        sagas,
        registry=registry,
        dead_letter_topic=Topics(settings.topic_prefix).name(settings.consumer.dead_letter_topic),
        handler_attempts=settings.consumer.handler_attempts,
        topic_prefix=settings.topic_prefix,
        history_payload=settings.history.payload,
        operator_key=operator_key(settings),
        operator_keys={n: k.get_secret_value().encode() for n, k in settings.operator.keys.items()},
        operator_expiry=settings.operator.expiry,
        handler_span=handler_span,
    )
    return BoundSagas(sagas, registry, planner)


def input_topics(settings: ProcessorSettings, bound: BoundSagas) -> list[str]:
    """The topics a processor consumes, with the topic prefix applied.

    Raises:
        ValueError: ``SAGA_CONSUMER__TOPICS`` is unset and a handled event type names no topic.
    """
    topics = Topics(settings.topic_prefix)
    if settings.consumer.topics:
        return [topics.name(t) for t in settings.consumer.topics]
    types = bound.planner.event_types
    missing = [cls.__name__ for cls in types if bound.registry.of(cls).topic is None]
    if missing:
        raise ValueError(f"no input topic known for {missing}: set SAGA_CONSUMER__TOPICS")
    found = {bound.registry.of(cls).topic for cls in types}
    return sorted(topics.name(t) for t in found if t)


@contextmanager
def open_sagas(
    settings: ProcessorSettings, app: SagaApp | None
) -> Iterator[tuple[list[type[Any]] | None, dict[type, object]]]:
    """The saga classes and dependencies a process runs, built once and closed on leaving.

    With an app: its sagas, and its dependencies with the factories' products (closed on
    leaving, in reverse order). Without one: None (so `bind_sagas` loads `settings.sagas`) and
    no dependencies.

    Raises:
        ConfigurationError: Both the app and `SAGA_SAGAS` name sagas, or a handler parameter is
            provided by nothing (raised before any factory runs).
    """
    if app is None:
        yield None, {}
        return
    if settings.sagas:
        raise ConfigurationError(
            [
                f"SAGA_SAGAS: {settings.sagas} is set, but the app {app!r} names the sagas; "
                "unset SAGA_SAGAS, or run without the app"
            ]
        )
    with app.open(settings) as dependencies:
        yield list(app.sagas), dependencies
