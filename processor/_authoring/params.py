"""Classify a handler's parameters by their declared types.

Handlers ask for what they need by annotation, in any order. This module turns each annotation
into a :class:`Param` once, at import time, so the runtime only looks values up.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from processor._authoring.handles import SagaCommands, SagaDeadlines, SagaLifecycle, Setting
from processor._authoring.messages import Message, MessageMetadata

__all__ = ["HANDLES_BUNDLE", "NO_DEFAULT", "Param", "ParamKind", "classify_params"]

ParamKind = Literal[
    "event",
    "payload",
    "commands",
    "deadlines",
    "lifecycle",
    "handles",
    "metadata",
    "setting",
    "dependency",
]

NO_DEFAULT: Any = inspect.Parameter.empty
"""Marks a parameter without a Python default."""

_HANDLES: dict[type, ParamKind] = {
    SagaCommands: "commands",
    SagaDeadlines: "deadlines",
    SagaLifecycle: "lifecycle",
    MessageMetadata: "metadata",
}

HANDLES_BUNDLE = "__saga_handles__"
"""A class with this attribute set to True is built from the run's commands, deadlines and
lifecycle handles, in that order (``processor._authoring.orchestration.HandlerIo``): kind
``"handles"``."""


@dataclass(frozen=True)
class Param:
    """One resolved handler parameter.

    Attributes:
        name: Parameter name.
        kind: What the runtime injects.
        annotation: The declared type with ``Annotated`` and ``| None`` stripped (for settings,
            ``Annotated`` only is stripped, so an optional setting validates None).
        setting_key: The settings key for ``kind == "setting"``.
        optional: Whether the parameter has a default or accepts None.
        default: The parameter's Python default, or :data:`NO_DEFAULT`.
        setting: The :class:`Setting` marker for ``kind == "setting"``.
    """

    name: str
    kind: ParamKind
    annotation: Any
    setting_key: str | None
    optional: bool
    default: Any = NO_DEFAULT
    setting: Setting | None = None


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(rest) < len(args):
            return rest[0], True
    return annotation, False


def _is_message_cls(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, Message)


def classify_params(
    func: Callable[..., Any],
    *,
    kind: Literal["event", "deadline"],
    event_type: type[Message] | None,
    localns: dict[str, Any],
    problems: list[str],
) -> tuple[tuple[Param, ...], type[Message] | None]:
    """Resolve every parameter of ``func`` except ``self``.

    Args:
        func: The handler function.
        kind: Whether it handles events or deadlines.
        event_type: For event handlers, the type given to the decorator, if any.
        localns: Extra names for resolving string annotations (the saga class).
        problems: Problems found are appended here, each naming the handler and the fix.

    Returns:
        The parameters, and for event handlers the (given or inferred) event type.
    """
    where = f"handler {func.__qualname__}"
    try:
        hints = typing.get_type_hints(func, localns=localns, include_extras=True)
    except Exception as e:
        problems.append(
            f"{where}: cannot resolve annotations ({type(e).__name__}: {e}); import the "
            "types at module level"
        )
        return (), event_type
    signature = inspect.signature(func)
    declared = list(signature.parameters.values())
    if not declared or declared[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        problems.append(f"{where}: must be an instance method taking self first")
        return (), event_type

    params: list[Param] = []
    message_params: list[tuple[inspect.Parameter, type[Message], bool]] = []
    for p in declared[1:]:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            problems.append(f"{where}: *args/**kwargs are not resolvable; declare each parameter")
            continue
        if p.name not in hints:
            problems.append(
                f"{where}: parameter {p.name!r} has no type annotation; annotate it so it "
                "can be resolved"
            )
            continue
        annotation = hints[p.name]
        has_default = p.default is not inspect.Parameter.empty
        if typing.get_origin(annotation) is Annotated:
            inner, *extras = typing.get_args(annotation)
            settings = [x for x in extras if isinstance(x, Setting)]
            if len(settings) > 1:
                problems.append(f"{where}: parameter {p.name!r} has several Setting markers")
                continue
            if settings:
                setting = settings[0]
                _, accepts_none = _strip_optional(inner)
                params.append(
                    Param(
                        p.name,
                        "setting",
                        inner,
                        setting.key,
                        has_default or accepts_none or setting.has_default,
                        p.default,
                        setting,
                    )
                )
                continue
            annotation = inner
        base, accepts_none = _strip_optional(annotation)
        optional = has_default or accepts_none
        handle_kind = _HANDLES.get(base) if isinstance(base, type) else None
        if getattr(base, HANDLES_BUNDLE, False) is True:
            handle_kind = "handles"
        if handle_kind == "metadata" and kind == "deadline":
            problems.append(
                f"{where}: parameter {p.name!r} asks for MessageMetadata, but a deadline is a "
                "timer, not a message; keep the context you need in the saga state instead"
            )
        elif handle_kind is not None:
            params.append(Param(p.name, handle_kind, base, None, optional, p.default))
        elif kind == "event" and _is_message_cls(base):
            message_params.append((p, base, optional))
            params.append(Param(p.name, "event", base, None, optional, p.default))
        elif kind == "event":
            params.append(Param(p.name, "dependency", base, None, optional, p.default))
        else:
            # Deadline handlers: the binder decides later whether this is the payload or a
            # registered dependency, because only it knows which dependencies exist.
            params.append(Param(p.name, "payload", base, None, optional, p.default))

    if kind == "event":
        event_type = _check_event_param(where, event_type, message_params, problems)
    return tuple(params), event_type


def _check_event_param(
    where: str,
    event_type: type[Message] | None,
    message_params: list[tuple[inspect.Parameter, type[Message], bool]],
    problems: list[str],
) -> type[Message] | None:
    names = ", ".join(repr(p.name) for p, _, _ in message_params)
    if len(message_params) > 1:
        problems.append(
            f"{where}: several parameters ({names}) are messages; exactly one parameter "
            "receives the event"
        )
        return event_type
    if not message_params:
        what = event_type.__qualname__ if event_type else "the event class"
        problems.append(f"{where}: add a parameter annotated with {what} to receive the event")
        return event_type
    p, annotated, _ = message_params[0]
    if event_type is None:
        return annotated
    if not issubclass(event_type, annotated):
        problems.append(
            f"{where}: parameter {p.name!r} is annotated {annotated.__qualname__} but the "
            f"handler is declared for {event_type.__qualname__}; make them agree"
        )
    return event_type
