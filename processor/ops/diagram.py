"""Finds a state machine saga by name, for `diagram MODULE:SAGA` and `lint-saga MODULE:SAGA`.

Neither needs the database or Kafka: they read the saga class only.
"""

from __future__ import annotations

import importlib

from processor.errors import SagaError
from processor.machine import MachineSaga, MachineSpec

__all__ = ["load_spec"]


def load_spec(target: str) -> MachineSpec:
    """Import ``module:Class`` and describe its state machine.

    Raises:
        SagaError: The target is malformed, missing, or not a state machine saga.
    """
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SagaError(
            f"name the saga as MODULE:CLASS, e.g. sagas.order:OrderSaga; got {target!r}"
        )
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise SagaError(f"cannot load {target!r}: {type(e).__name__}: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, MachineSaga)):
        raise SagaError(
            f"{target} is not a state machine saga (subclass processor.machine.MachineSaga)"
        )
    return cls.machine_spec()
