"""Saga declaration: the state base class and the decorators, validated at import time.

The method decorators only mark functions. The class decorator inspects the whole class once and
raises a single :class:`SagaDefinitionError` listing every problem, so an author fixes all of
them in one pass instead of one per restart.
"""

from __future__ import annotations

import builtins
import inspect
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar, overload

from pydantic import BaseModel, ConfigDict

from processor._authoring.marks import SAGA, tag, used_bare
from processor._authoring.messages import Message
from processor._authoring.params import Param
from processor._authoring.saga_model import (
    DEFINITION,
    MARK,
    HandlerDef,
    Mark,
    SagaDefinition,
    SagaState,
    build,
    definition_of,
)
from processor._errors import SagaDefinitionError

__all__ = [
    "HandlerDef",
    "Param",
    "SagaDefinition",
    "SagaState",
    "definition_of",
    "saga",
    "saga_deadline_handler",
    "saga_event_handler",
]

_F = TypeVar("_F", bound=Callable[..., Any])


def _marker(mark: Mark, decorator: str) -> Callable[[_F], _F]:
    def add_mark(func: _F) -> _F:
        if not inspect.isfunction(func):
            raise SagaDefinitionError(
                [f"saga handler decorators apply to plain methods, not {type(func).__name__}"]
            )
        marks: tuple[Mark, ...] = getattr(func, MARK, ())
        setattr(func, MARK, (*marks, mark))
        tag(func, SAGA, f"@{decorator}")
        return func

    return add_mark


@overload
def saga_event_handler(
    event_type: type[Message] | None = None,
    *,
    association_property: str | None = None,
    start: bool = False,
    end: bool = False,
) -> Callable[[_F], _F]: ...
@overload
def saga_event_handler(event_type: Callable[..., None], /) -> NoReturn: ...
def saga_event_handler(
    event_type: Any = None,
    *,
    association_property: Any = None,
    start: bool = False,
    end: bool = False,
) -> Any:
    """Mark a saga method as the handler of one event type.

    Args:
        event_type: The event class; inferred from the one Message-annotated parameter when
            omitted.
        association_property: Field of the event whose value is the saga id; defaults to the
            saga's (``@saga(..., association_property=...)``).
        start: The event may start a new saga instance.
        end: The saga ends after this handler runs.

    Returns:
        The decorator; it returns the function unchanged apart from the mark.

    Raises:
        SagaDefinitionError: Used bare (``@saga_event_handler``): the association property
            cannot be guessed.
    """
    # A callable that is not a class is the method itself: the decorator was written bare.
    if callable(event_type) and not isinstance(event_type, type):
        raise used_bare(
            "saga_event_handler",
            event_type,
            "@saga_event_handler(association_property='...'); the event type is read from "
            "the parameter annotated with it",
        )
    return _marker(
        Mark("event", event_type, association_property, start, end), "saga_event_handler"
    )


def saga_deadline_handler(name: str, *, end: bool = False) -> Callable[[_F], _F]:
    """Mark a saga method as the handler of a named deadline.

    The handler may take the deadline's payload (by its declared type), ``SagaCommands``,
    ``SagaDeadlines``, ``SagaLifecycle``, settings and dependencies, but not message metadata.

    Args:
        name: The deadline name passed to ``SagaDeadlines.schedule``.
        end: The saga ends after this handler runs.

    Returns:
        The decorator; it returns the function unchanged apart from the mark.

    Raises:
        SagaDefinitionError: Used bare (``@saga_deadline_handler``): the name is needed.
    """
    if callable(name):
        raise used_bare("saga_deadline_handler", name, "@saga_deadline_handler('payment-timeout')")
    return _marker(Mark("deadline", name, None, False, end), "saga_deadline_handler")


CANCEL_HANDLER = "saga.cancel"
"""The name a cancel handler is kept under among the deadline handlers (it runs like one)."""


class CancelRequest(BaseModel):
    """What a cancel handler is told: who cancelled the saga and why.

    Attributes:
        reason: The operator's reason (``saga cancel --reason``).
        by: Who asked.
    """

    model_config = ConfigDict(frozen=True)

    reason: str
    by: str = ""


@overload
def saga_cancel_handler(func: _F, /) -> _F: ...
@overload
def saga_cancel_handler(*, end: bool = False) -> Callable[[_F], _F]: ...
def saga_cancel_handler(func: Callable[..., Any] | None = None, /, *, end: bool = False) -> Any:
    """Mark a saga method as what ``saga cancel`` runs: the saga's compensation.

    It takes what a deadline handler takes (handles, settings, dependencies) and, by its type,
    the :class:`CancelRequest`. It usually sends the undo commands and lets the replies end the
    saga; ``end=True`` ends it right after. A saga without one (and not an orchestrated saga,
    which compensates by itself) refuses ``saga cancel``; ``saga terminate --force`` still ends
    it, undoing nothing. Written bare (``@saga_cancel_handler``) it takes the defaults.

    Args:
        func: The method, when the decorator is written without parentheses.
        end: The saga ends after this handler runs.

    Returns:
        The decorator (or, used bare, the marked method).
    """
    decorate = _marker(Mark("deadline", CANCEL_HANDLER, None, False, end), "saga_cancel_handler")
    return decorate if func is None else decorate(func)


DECISION_HANDLER = "saga.decision"
"""The name a decision handler is kept under among the deadline handlers (it runs like one)."""


class DecisionRequest(BaseModel):
    """What a decision handler is told: a person's decision for a saga waiting on one.

    Attributes:
        decision: What was decided (``saga resolve TYPE ID DECISION``), e.g. ``"retry"``.
        reason: Why.
        by: Who decided.
    """

    model_config = ConfigDict(frozen=True)

    decision: str
    reason: str = ""
    by: str = ""


@overload
def saga_decision_handler(func: _F, /) -> _F: ...
@overload
def saga_decision_handler(*, end: bool = False) -> Callable[[_F], _F]: ...
def saga_decision_handler(func: Callable[..., Any] | None = None, /, *, end: bool = False) -> Any:
    """Mark a saga method as what ``saga resolve`` runs for a saga waiting on a person.

    The plain-saga counterpart of an orchestrated saga's escalation: a handler calls
    ``lifecycle.escalate(reason)``, a person looks, and an operator's ``saga-processor saga
    resolve TYPE ID DECISION --reason WHY`` runs this handler with a :class:`DecisionRequest`
    (plus the usual handles, settings and dependencies). A saga without one refuses resolve.
    Written bare (``@saga_decision_handler``) it takes the defaults.

    Args:
        func: The method, when the decorator is written without parentheses.
        end: The saga ends after this handler runs.

    Returns:
        The decorator (or, used bare, the marked method).
    """
    mark = Mark("deadline", DECISION_HANDLER, None, False, end)
    decorate = _marker(mark, "saga_decision_handler")
    return decorate if func is None else decorate(func)


_S = TypeVar("_S", bound=type[SagaState])


@overload
def saga(
    *,
    type: str | None = None,
    saga_type: str | None = None,
    version: int = 1,
    association_property: str | None = None,
) -> Callable[[_S], _S]: ...
@overload
def saga(cls: builtins.type[Any], /) -> NoReturn: ...
def saga(
    cls: Any = None,
    /,
    *,
    type: str | None = None,
    saga_type: str | None = None,
    version: int = 1,
    association_property: str | None = None,
) -> Any:
    """Class decorator declaring a saga.

    Args:
        cls: Only set when the decorator is written bare, which is refused.
        type: The saga's type name, stored with each instance and sent in command headers.
        saga_type: Alias of ``type`` for callers that avoid shadowing the builtin.
        version: The state's version. Bump it when a change to the fields would not load a
            stored state (a rename, a removal, a new required meaning) and register an
            upcaster from the previous version (see
            :func:`processor._authoring.upcasting.upcaster`).
        association_property: The event field holding the saga id, said once for the whole
            saga: every event handler that does not name its own uses it, as do the handlers
            an orchestration generates (``Step(..., replies=...)``, ``Orchestration(start=...)``).

    Returns:
        The decorator. It validates the class and raises :class:`SagaDefinitionError` listing
        every problem, or attaches a :class:`SagaDefinition` read by :func:`definition_of`.

    Raises:
        SagaDefinitionError: Used bare (``@saga``): the type name is stored with every
            instance, so it is written out rather than guessed from the class name.
    """
    if cls is not None:
        raise used_bare("saga", cls, "@saga(type='my-saga')")

    def decorate(klass: _S) -> _S:
        definition = build(klass, type, saga_type, version, association_property)
        setattr(klass, DEFINITION, definition)
        return klass

    return decorate
