"""``@saga_function``: a saga written as one ``async def``, turned into a saga class.

The class it makes is an ordinary saga to the rest of the processor (the app, the fixture,
``show``, the console, the AsyncAPI contract): its state is the function's journal, and its
handlers are generated: one per event the function awaits (read from the function's source,
or listed in ``events=``), the timer of its awaits, its own deadline, and the operators'
cancel and resolve.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import textwrap
import typing
from collections.abc import Callable, Coroutine, Iterable
from datetime import timedelta
from typing import Annotated, Any, TypeVar

from pydantic import create_model

from processor._authoring.definition import (
    CancelRequest,
    DecisionRequest,
    definition_of,
    saga,
    saga_cancel_handler,
    saga_deadline_handler,
    saga_decision_handler,
    saga_event_handler,
)
from processor._authoring.functions.journal import FunctionState, TimerPayload
from processor._authoring.functions.turn import DEADLINE, TIMER, FunctionSpec, Turn
from processor._authoring.handles import SagaCommands, SagaDeadlines, SagaLifecycle, Setting
from processor._authoring.marks import SAGA, tag
from processor._authoring.messages import Message, registry
from processor._authoring.orchestration.steps import Escalation
from processor._errors import SagaDefinitionError

builtins_type = type

__all__ = ["CACHE_SIZE", "JOURNAL_LIMIT", "function_spec", "saga_function"]

JOURNAL_LIMIT = "saga_functions.journal_limit"
"""Setting: the most entries a saga function's journal may hold; past it the saga is parked."""
CACHE_SIZE = "saga_functions.cache_size"
"""Setting: how many suspended saga functions a replica keeps in memory (0: replay always)."""

_LIMIT_PARAM = "saga_functions_journal_limit"
_SIZE_PARAM = "saga_functions_cache_size"
_OURS = {
    _LIMIT_PARAM: (Annotated[int, Setting(JOURNAL_LIMIT, default=1000)], inspect.Parameter.empty),
    _SIZE_PARAM: (Annotated[int, Setting(CACHE_SIZE, default=10_000)], inspect.Parameter.empty),
}
_SPEC = "__saga_function__"

_F = TypeVar("_F", bound=Callable[..., Coroutine[Any, Any, Any]])


def function_spec(cls: type) -> FunctionSpec | None:
    """The declared function behind a class ``@saga_function`` made, or None."""
    found = getattr(cls, _SPEC, None)
    return found if isinstance(found, FunctionSpec) else None


def saga_function(
    *,
    type: str,
    association_property: str,
    sla: timedelta | None = None,
    escalation: Callable[[Any, Escalation], Message] | None = None,
    decisions: type[Message] | None = None,
    events: Iterable[type[Message]] = (),
    version: int = 1,
) -> Callable[[_F], builtins.type[FunctionState]]:
    """Declare a saga written as one ``async def`` taking its context and its start event.

    Example::

        @saga_function(type="trip", association_property="trip_id")
        async def trip(saga: SagaContext, booking: BookTrip) -> None:
            await saga.call(ReserveFlight(...), expects=FlightReserved, rejects=NoSeats)

    The function is replayed against its journal after a restart, so it must do the same
    thing each time it runs: it reads time, randomness and ids from its context, does no I/O
    of its own, and guards a change under in-flight sagas with ``saga.patched(...)``. Further
    parameters are settings and dependencies, injected as into any handler.

    Args:
        type: The saga's type name.
        association_property: The field of the start event and of every awaited event that
            holds the saga id.
        sla: The saga's own deadline from its start: when it passes, the await in progress
            raises :class:`DeadlinePassed` and the saga's undos run (outcome ``TIMED_OUT``).
        escalation: Builds the command that asks a person (a failed undo, ``saga.escalate``),
            from the start event and an :class:`Escalation`.
        decisions: The event class carrying a person's decision (a ``decision`` field:
            ``retry``, ``skip`` or ``compensate``); ``saga resolve`` decides too.
        events: Events the function awaits that its source does not name where they can be
            read (``expects=``, ``rejects=``, ``retry_on=``, ``wait(...)``).
        version: The state's version (see ``@saga``).

    Returns:
        The decorator; it returns the saga class, which is what ``SagaApp(sagas=...)`` and
        ``SagaFixture`` take.
    """

    # ``type`` names the saga's type here, as in ``@saga``; the builtin is ``builtins_type``.
    def decorate(func: _F) -> builtins.type[FunctionState]:
        return _build(
            func, type, association_property, sla, escalation, decisions, tuple(events), version
        )

    return decorate


def _build(
    func: Callable[..., Coroutine[Any, Any, Any]],
    saga_type: str,
    association_property: str,
    sla: timedelta | None,
    escalation: Callable[[Any, Escalation], Message] | None,
    decisions: type[Message] | None,
    events: tuple[type[Message], ...],
    version: int,
) -> type[FunctionState]:
    where = f"saga function {getattr(func, '__qualname__', func)!r}"
    problems: list[str] = []
    if not inspect.iscoroutinefunction(func):
        raise SagaDefinitionError(
            ["a saga function is an `async def` taking (saga: SagaContext, event: StartEvent)"],
            subject=where,
        )
    start, extras = _signature(func, problems)
    found, unread = _awaited(func)
    if not events:
        problems.extend(unread)
    awaited = [*found, *events, *([decisions] if decisions is not None else [])]
    for given in awaited:
        if not (isinstance(given, builtins_type) and issubclass(given, Message)):
            problems.append(f"events= takes message classes, got {given!r}")
    if decisions is not None and "decision" not in getattr(decisions, "model_fields", {}):
        problems.append(
            f"decisions={decisions!r} needs a `decision` field (retry, skip, compensate)"
        )
    if problems or start is None:
        raise SagaDefinitionError(problems, subject=where)
    spec = FunctionSpec(func, saga_type, start, decisions, escalation, sla)
    fields: dict[str, Any] = {"start": (start | None, None)}
    cls: type[FunctionState] = create_model(
        func.__name__,
        __base__=FunctionState,
        __module__=func.__module__,
        __doc__=func.__doc__,
        **fields,
    )
    cls.__qualname__ = func.__qualname__
    setattr(cls, _SPEC, spec)
    ordered = list(dict.fromkeys(c for c in awaited if c is not start))
    _install(cls, spec, association_property, start, ordered, extras)
    made: type[FunctionState] = saga(
        type=saga_type, association_property=association_property, version=version
    )(cls)
    spec.handled = frozenset(registry.of(c).name for c in definition_of(made).event_handlers)
    return made


def _signature(
    func: Callable[..., Any], problems: list[str]
) -> tuple[type[Message] | None, dict[str, tuple[Any, Any]]]:
    """The start event class, and the further parameters: name -> (annotation, default)."""
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception as e:
        problems.append(f"cannot resolve the annotations ({type(e).__name__}: {e})")
        return None, {}
    params = list(inspect.signature(func).parameters.values())
    if len(params) < 2:
        problems.append("take the context and the start event: (saga: SagaContext, event: Start)")
        return None, {}
    start = hints.get(params[1].name)
    if not (isinstance(start, builtins_type) and issubclass(start, Message)):
        problems.append(
            f"annotate the second parameter, {params[1].name!r}, with the start event's class"
        )
        start = None
    extras: dict[str, tuple[Any, Any]] = {}
    for p in params[2:]:
        if p.name not in hints:
            problems.append(f"parameter {p.name!r} has no annotation; annotate it to inject it")
            continue
        extras[p.name] = (hints[p.name], p.default)
    return start, extras


def _awaited(func: Callable[..., Any]) -> tuple[list[type[Message]], list[str]]:
    """The event classes the function's source names where it awaits, and what it cannot read.

    Read from ``expects=``, ``rejects=`` and ``retry_on=`` arguments (of ``call`` and ``Undo``)
    and from the first argument of ``wait``, evaluated in the function's module.
    """
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return [], []
    namespace = dict(func.__globals__)
    namespace.update(inspect.getclosurevars(func).nonlocals)
    found: list[type[Message]] = []
    unread: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        named = (
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        )
        exprs = [kw.value for kw in node.keywords if kw.arg in ("expects", "rejects", "retry_on")]
        if named == "wait" and node.args:
            exprs.append(node.args[0])
        for expr in exprs:
            try:
                value = eval(compile(ast.Expression(expr), "<saga function>", "eval"), namespace)
            except Exception:
                value = None
            classes = value if isinstance(value, tuple) else (value,)
            if value is None or not all(
                isinstance(c, builtins_type) and issubclass(c, Message) for c in classes
            ):
                unread.append(
                    f"line {node.lineno}: cannot tell which events `{ast.unparse(expr)}` names "
                    "before the saga runs; name the classes there, or list every awaited event "
                    "in @saga_function(events=...)"
                )
                continue
            found.extend(classes)
    return found, unread


def _install(
    cls: type[FunctionState],
    spec: FunctionSpec,
    association_property: str,
    start: type[Message],
    awaited: list[type[Message]],
    extras: dict[str, Any],
) -> None:
    """Set the generated handlers on ``cls`` (before ``@saga`` reads them)."""

    def run(
        state: FunctionState,
        what: Callable[[Turn], bool],
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        configured: dict[str, Any],
    ) -> None:
        limit = configured.pop(_LIMIT_PARAM)
        size = configured.pop(_SIZE_PARAM)
        event = getattr(state, "start", None)
        assert event is not None, "a saga function's state keeps its start event"
        saga_id = str(getattr(event, association_property))
        turn = Turn(spec, state, saga_id, commands, deadlines, lifecycle, journal_limit=limit)
        before = state.chain
        if what(turn):
            turn.run(event, configured, size, before)

    def on_start(
        self: FunctionState,
        event: Any,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        **configured: Any,
    ) -> None:
        if getattr(self, "start", None) is None:
            setattr(self, "start", event)  # noqa: B010 (a field of the class made per saga)
        run(self, lambda t: t.begin(event), commands, deadlines, lifecycle, configured)

    def on_event(
        self: FunctionState,
        event: Any,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        **configured: Any,
    ) -> None:
        run(self, lambda t: t.event(event), commands, deadlines, lifecycle, configured)

    def on_timer(
        self: FunctionState,
        timer: Any,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        **configured: Any,
    ) -> None:
        run(
            self,
            lambda t: t.timer(timer.seq, timer.attempt),
            commands,
            deadlines,
            lifecycle,
            configured,
        )

    def on_deadline(
        self: FunctionState,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        **configured: Any,
    ) -> None:
        run(self, lambda t: t.deadline(), commands, deadlines, lifecycle, configured)

    def on_cancel(
        self: FunctionState,
        request: Any,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        **configured: Any,
    ) -> None:
        run(self, lambda t: t.cancel(), commands, deadlines, lifecycle, configured)

    def on_decision(
        self: FunctionState,
        request: Any,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        **configured: Any,
    ) -> None:
        run(self, lambda t: t.decide(request.decision), commands, deadlines, lifecycle, configured)

    extra = {**extras, **_OURS}
    handlers: dict[str, Callable[..., None]] = {}
    handlers[f"on_{start.__name__}"] = saga_event_handler(start, start=True)(
        _shaped(on_start, f"on_{start.__name__}", ("event", start), extra)
    )
    for event_cls in awaited:
        name = f"on_{event_cls.__name__}"
        handlers[name] = saga_event_handler(event_cls)(
            _shaped(on_event, name, ("event", event_cls), extra)
        )
    handlers["on_timer"] = saga_deadline_handler(TIMER)(
        _shaped(on_timer, "on_timer", ("timer", TimerPayload), extra)
    )
    if spec.sla is not None:
        handlers["on_deadline"] = saga_deadline_handler(DEADLINE)(
            _shaped(on_deadline, "on_deadline", None, extra)
        )
    handlers["on_cancel"] = saga_cancel_handler(
        _shaped(on_cancel, "on_cancel", ("request", CancelRequest), extra)
    )
    handlers["on_decision"] = saga_decision_handler(
        _shaped(on_decision, "on_decision", ("request", DecisionRequest), extra)
    )
    for name, handler in handlers.items():
        tag(handler, SAGA, "@saga_function")
        setattr(cls, name, handler)
    _ = association_property


def _shaped(
    body: Callable[..., None],
    name: str,
    first: tuple[str, Any] | None,
    extra: dict[str, Any],
) -> Callable[..., None]:
    """A handler calling ``body``, with the signature the runtime resolves parameters from."""

    def handler(self: Any, *args: Any, **configured: Any) -> None:
        body(self, *args, **configured)

    handler.__name__ = name
    handler.__qualname__ = name
    handles = {"commands": SagaCommands, "deadlines": SagaDeadlines, "lifecycle": SagaLifecycle}
    leading = dict([first]) if first is not None else {}
    annotations = {n: t for n, (t, _) in extra.items()}
    handler.__annotations__ = {**leading, **handles, **annotations, "return": None}
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    handler.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("self", positional),
            *(inspect.Parameter(n, positional, annotation=t) for n, t in leading.items()),
            *(inspect.Parameter(n, positional, annotation=t) for n, t in handles.items()),
            *(
                inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=t, default=d)
                for n, (t, d) in extra.items()
            ),
        ],
        return_annotation=None,
    )
    return handler
