"""Resolve handler parameters against settings and dependencies at startup.

Everything that can be known before the first message is checked here, and every problem is
reported at once, so a misconfigured deployment fails at start instead of at 3 a.m. on the first
timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from pydantic import TypeAdapter, ValidationError

from processor._authoring.definition import HandlerDef
from processor._authoring.params import NO_DEFAULT, Param
from processor._errors import SagaDefinitionError

__all__ = ["ResolvedParam", "lookup_setting", "resolve_handler"]

_ABSENT: Any = object()


@dataclass(frozen=True)
class ResolvedParam:
    """A parameter and how the runner obtains its value.

    Attributes:
        param: The parameter as classified at import.
        constant: True when ``value`` is injected as is (settings and dependencies).
        value: The injected value when ``constant``.
        adapter: Validator of the deadline payload for ``kind == "payload"``.
    """

    param: Param
    constant: bool = False
    value: Any = None
    adapter: TypeAdapter[Any] | None = None


def lookup_setting(settings: Mapping[str, Any], key: str) -> Any:
    """Return the value of ``key``, or a private sentinel when absent.

    A flat ``{"transfer.max-amount": 5}`` and a nested ``{"transfer": {"max-amount": 5}}``
    both work, matching how pydantic-settings models nest.
    """
    if key in settings:
        return settings[key]
    node: Any = settings
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _setting(p: Param, settings: Mapping[str, Any], where: str, problems: list[str]) -> Any:
    assert p.setting is not None
    raw = lookup_setting(settings, p.setting.key)
    if raw is _ABSENT:
        if p.setting.has_default:
            raw = p.setting.default
        elif p.default is not NO_DEFAULT:
            raw = p.default
        else:
            problems.append(f"{where}: setting {p.setting.key!r} is missing; configure it")
            return None
    try:
        return TypeAdapter(p.annotation).validate_python(raw)
    except ValidationError as e:
        # Messages only, never the input: settings may hold secrets.
        reasons = "; ".join(err["msg"] for err in e.errors(include_input=False, include_url=False))
        problems.append(f"{where}: setting {p.setting.key!r} is invalid: {reasons}")
        return None
    except SagaDefinitionError as e:
        # A value type that validates itself (a RetryPolicy) lists its own problems.
        reasons = "; ".join(e.problems)
        problems.append(f"{where}: setting {p.setting.key!r} is invalid: {reasons}")
        return None


def _find_dependency(annotation: Any, dependencies: Mapping[type, object]) -> list[object]:
    if annotation in dependencies:
        return [dependencies[annotation]]
    # Also accept a dependency registered under a subclass of the declared type, so a handler
    # can ask for an interface and the entrypoint register the implementation.
    found = []
    for key, value in dependencies.items():
        try:
            if isinstance(annotation, type) and issubclass(key, annotation):
                found.append(value)
        except TypeError:
            continue
    return found


def resolve_handler(
    handler: HandlerDef,
    settings: Mapping[str, Any],
    dependencies: Mapping[type, object],
    problems: list[str],
    *,
    app: str = "SagaApp",
) -> tuple[ResolvedParam, ...]:
    """Resolve each parameter of ``handler``, appending problems to ``problems``.

    Args:
        handler: The handler.
        settings: Setting values by key.
        dependencies: Registered dependencies by type.
        problems: Where each problem goes.
        app: The application class that registers dependencies for this handler (named in the
            fix a problem suggests).
    """
    where = f"handler {handler.name}"
    out: list[ResolvedParam] = []
    payloads: list[Param] = []
    for p in handler.params:
        if p.kind == "setting":
            out.append(ResolvedParam(p, True, _setting(p, settings, where, problems)))
        elif p.kind in ("dependency", "payload"):
            found = _find_dependency(p.annotation, dependencies)
            if len(found) == 1:
                dep = (
                    p
                    if p.kind == "dependency"
                    else Param(p.name, "dependency", p.annotation, None, p.optional, p.default)
                )
                out.append(ResolvedParam(dep, True, found[0]))
            elif len(found) > 1:
                problems.append(
                    f"{where}: parameter {p.name!r} matches {len(found)} dependencies; register "
                    f"exactly one for {_name(p.annotation)}"
                )
            elif p.kind == "payload":
                payloads.append(p)
            elif p.optional:
                out.append(ResolvedParam(p, True, None if p.default is NO_DEFAULT else p.default))
            else:
                problems.append(_missing(where, p, app))
        else:
            out.append(ResolvedParam(p))
    if len(payloads) > 1:
        names = ", ".join(repr(p.name) for p in payloads)
        problems.append(
            f"{where}: parameters {names} are neither handles, settings nor registered "
            "dependencies; a deadline handler takes at most one payload parameter, so register "
            "the others as dependencies"
        )
    elif payloads:
        p = payloads[0]
        try:
            out.append(ResolvedParam(p, adapter=TypeAdapter(p.annotation)))
        except Exception as e:
            problems.append(
                f"{where}: payload parameter {p.name!r} has a type pydantic cannot validate "
                f"({type(e).__name__}); use a pydantic model, dataclass or plain type"
            )
    return tuple(out)


# Types a handler more likely wants from configuration than from a registered object.
_VALUES = (str, int, float, bool, Decimal, timedelta, datetime)


def _missing(where: str, p: Param, app: str) -> str:
    """The problem of a parameter nothing provides, with the fix that most likely fits it."""
    name = _name(p.annotation)
    text = (
        f"{where}: parameter {p.name!r} needs a dependency of type {name}; provide one in the "
        f"app: {app}(dependencies={{{name}: ...}}) or factories="
    )
    if isinstance(p.annotation, type) and issubclass(p.annotation, _VALUES):
        text += f"; or, for a configured value, Annotated[{name}, Setting('some.key')]"
    return text


def _name(annotation: Any) -> str:
    return getattr(annotation, "__qualname__", repr(annotation))
