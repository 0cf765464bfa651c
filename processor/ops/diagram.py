"""Finds a state machine saga, for `diagram TARGET` and `lint-saga TARGET`.

TARGET is `MODULE:CLASS`, or the application object `MODULE:ATTR` (then `--saga` picks one of its
state machine sagas, unless it has only one). Neither command needs the database or Kafka: they
read the saga class only.
"""

from __future__ import annotations

import importlib
from typing import Any

from processor.application import SagaApp
from processor.definition import definition_of
from processor.errors import SagaDefinitionError, SagaError
from processor.machine import MachineSaga, MachineSpec

__all__ = ["load_spec"]


def load_spec(target: str, saga: str | None = None) -> MachineSpec:
    """Import ``module:Class`` (or an app's saga) and describe its state machine.

    Args:
        target: `MODULE:CLASS`, or `MODULE:ATTR` naming a `SagaApp`.
        saga: With an app: the saga type or class name to describe.

    Raises:
        SagaError: The target is malformed, missing, or not a state machine saga.
    """
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SagaError(
            f"name the saga as MODULE:CLASS (or an app as MODULE:ATTR), e.g. "
            f"sagas.order:OrderSaga; got {target!r}"
        )
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as e:
        raise SagaError(f"cannot load {target!r}: {type(e).__name__}: {e}") from e
    if isinstance(found, SagaApp):
        found = _pick(target, found, saga)
    if not (isinstance(found, type) and issubclass(found, MachineSaga)):
        raise SagaError(
            f"{target} is not a state machine saga (subclass processor.machine.MachineSaga)"
        )
    return found.machine_spec()


def _pick(target: str, app: SagaApp, saga: str | None) -> type[MachineSaga]:
    machines = [c for c in app.sagas if isinstance(c, type) and issubclass(c, MachineSaga)]
    names = {name: c for c in machines for name in (c.__name__, _saga_type(c))}
    if saga is not None:
        if saga not in names:
            raise SagaError(
                f"{target} runs no state machine saga named {saga!r}; it has {sorted(names)}"
            )
        return names[saga]
    if len(machines) != 1:
        raise SagaError(
            f"{target} runs {len(machines)} state machine sagas; pick one with --saga "
            f"(one of {sorted(c.__name__ for c in machines)})"
        )
    return machines[0]


def _saga_type(cls: type[Any]) -> str:
    try:
        return definition_of(cls).saga_type
    except SagaDefinitionError:
        return cls.__name__
