"""`lint-saga TARGET`: the sagas a target names, and what is wrong with each.

A state machine saga is checked as its machine (:func:`processor._authoring.orchestration.lint`);
a saga function (``@saga_function``) by its source, for calls a replay would not repeat
(:mod:`processor._authoring.functions.lint`). TARGET is `MODULE:CLASS`, an application object
`MODULE:ATTR` (every saga of either kind it runs, or the one `--saga` names), or a `MODULE`
(every saga of either kind it holds). Nothing here needs the database or Kafka.
"""

from __future__ import annotations

import os
from typing import Any

from processor._authoring.application import SagaApp, import_module, import_target
from processor._authoring.definition import definition_of
from processor._authoring.functions.declare import function_spec
from processor._authoring.functions.lint import lint_function
from processor._authoring.orchestration import MachineSaga, lint
from processor._errors import SagaDefinitionError, SagaError

__all__ = ["lint_saga", "lintable", "sagas_to_lint"]

_KINDS = "state machine saga (subclass processor.MachineSaga) nor a saga function (@saga_function)"


def lint_saga(cls: type[Any]) -> list[str]:
    """The problems of one state machine saga or saga function, each naming the saga."""
    spec = function_spec(cls)
    if spec is None:
        return lint(cls.machine_spec())
    try:
        findings = lint_function(spec.func)
        path = _shown(spec.func.__code__.co_filename)
    except (OSError, TypeError, LookupError, SyntaxError) as e:
        # A function whose source is not on disk cannot be checked: say so, do not pass it.
        return [f"{spec.saga_type}: cannot read the saga function's source ({e})"]
    return [f"{spec.saga_type}: {path}:{f.line}: {f.describe()}" for f in findings]


def lintable(found: object) -> bool:
    """Whether ``found`` is a saga class `lint-saga` reads: a machine saga or a saga function."""
    if not isinstance(found, type):
        return False
    if function_spec(found) is not None:
        return True
    if not issubclass(found, MachineSaga):
        return False
    try:
        definition_of(found)  # the base classes a module imports are no sagas
    except SagaDefinitionError:
        return False
    return True


def sagas_to_lint(target: str, saga: str | None = None) -> list[type[Any]]:
    """The saga classes ``target`` names (and ``saga`` narrows), each one `lint-saga` reads.

    Raises:
        SagaError: The target is malformed, missing, or names no saga either lint reads.
    """
    if ":" not in target:
        try:
            module = import_module(target)
        except ImportError as e:
            raise SagaError(f"cannot load {target!r}: {type(e).__name__}: {e}") from e
        found = list({id(v): v for v in vars(module).values() if lintable(v)}.values())
        return _narrowed(f"module {target}", found, saga)
    loaded = import_target(
        target,
        "name the saga as MODULE:CLASS, an app as MODULE:ATTR, or a MODULE, e.g. "
        f"sagas.order:OrderSaga; got {target!r}",
    )
    if isinstance(loaded, SagaApp):
        return _narrowed(target, [c for c in loaded.sagas if lintable(c)], saga)
    if not lintable(loaded):
        raise SagaError(f"{target} is not a {_KINDS}")
    return [loaded]


def _narrowed(where: str, found: list[type[Any]], saga: str | None) -> list[type[Any]]:
    if not found:
        raise SagaError(f"{where} holds no {_KINDS.replace(' nor ', ' or ')}")
    if saga is None:
        return found
    names = {name: c for c in found for name in (c.__name__, definition_of(c).saga_type)}
    if saga not in names:
        raise SagaError(f"{where} has no such saga {saga!r}; it has {sorted(names)}")
    return [names[saga]]


def _shown(path: str) -> str:
    """``path`` relative to the working directory when it is below it, as editors link it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if relative.startswith("..") else relative
