"""`diagram MODULE:SAGA` prints a saga's state machine as Mermaid; `lint-saga` checks it.

Neither needs the database or Kafka: they read the saga class only.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from processor.cli import command
from processor.errors import SagaError
from processor.machine import MachineSaga, MachineSpec, lint, mermaid
from processor.settings import ProcessorSettings

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


def _target_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="MODULE:SAGA")


def diagram_command(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Prints the Mermaid ``stateDiagram-v2`` of the saga; exit code 0."""
    sys.stdout.write(mermaid(load_spec(args.target)))
    return 0


def lint_command(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Prints the machine's problems; exit code 1 when there are any."""
    problems = lint(load_spec(args.target))
    for line in problems:
        print(line)
    if not problems:
        print(f"{args.target}: no problems found")
    return 1 if problems else 0


command(
    "diagram",
    "print a state machine saga as a Mermaid stateDiagram-v2",
    arguments=_target_argument,
)(diagram_command)
command(
    "lint-saga",
    "report unreachable states, untimed WAITING states, lingering deadlines",
    arguments=_target_argument,
)(lint_command)
