"""A processor from its settings: the runtime's loops over the PostgreSQL and Kafka adapters."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from processor.bootstrap.adapters import Adapters
from processor.messages import MessageRegistry
from processor.messages import registry as default_registry
from processor.runtime.hooks import Hooks
from processor.runtime.processor import Processor
from processor.settings import ProcessorSettings

__all__ = ["build_processor"]


def build_processor(
    settings: ProcessorSettings,
    saga_classes: Iterable[type[Any]] | None = None,
    *,
    dependencies: Mapping[type, object] | None = None,
    registry: MessageRegistry = default_registry,
    hooks: Hooks | None = None,
    instance_id: str | None = None,
) -> Processor:
    """One replica, its adapters built from ``settings``; nothing connects before ``start()``.

    Args:
        settings: The processor's settings.
        saga_classes: Saga classes; None loads ``settings.sagas``.
        dependencies: Objects the sagas' handlers ask for.
        registry: Message types.
        hooks: Fault points for tests and benchmarks.
        instance_id: The replica's name; ``SAGA_INSTANCE_ID``, else one unique to the process.
    """
    return Processor(
        settings,
        saga_classes,
        adapters=Adapters(settings, instance_id),
        dependencies=dependencies,
        registry=registry,
        hooks=hooks,
    )
