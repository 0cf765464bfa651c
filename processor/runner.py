"""The pure core of the runtime: (state, input, now) -> outcome.

A :class:`BoundSaga` is a saga definition with every setting and dependency resolved at startup,
so a missing value stops the process before it consumes anything. Running a handler does no I/O:
it returns the new state and the recorded intents, and the engine persists them in one
transaction. The same code runs under the in-memory fixture in :mod:`processor.testing`.
"""

from __future__ import annotations

import copy
import hashlib
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from processor.binding import ResolvedParam, resolve_handler
from processor.definition import (
    CANCEL_HANDLER,
    DECISION_HANDLER,
    CancelRequest,
    DecisionRequest,
    HandlerDef,
    SagaDefinition,
    SagaState,
    definition_of,
)
from processor.errors import ConfigurationError, HandlerError, SagaError, SagaNotStarted
from processor.handles import (
    CommandIntent,
    DeadlineOp,
    SagaCommands,
    SagaDeadlines,
    SagaLifecycle,
    SagaOutcome,
    ScheduleDeadline,
)
from processor.messages import Message, MessageMetadata, MessageRegistry, registry
from processor.params import NO_DEFAULT
from processor.upcasting import StateUpcasters, state_upcasters

__all__ = [
    "BoundSaga",
    "DeadlineInput",
    "EventInput",
    "Outcome",
    "bind",
    "bind_all",
    "command_message_id",
    "state_to_json",
]

# Fixed namespace so command ids are identical on every replica and every replay.
_COMMAND_ID_NAMESPACE = uuid.UUID("5b0f6c2e-8d1a-4f57-9a43-2c7e1d9b6a10")
# The namespace's bytes hashed once; each id continues a copy of this hash.
_COMMAND_ID_HASH = hashlib.sha1(_COMMAND_ID_NAMESPACE.bytes)


def command_message_id(saga_type: str, saga_id: str, seq: int) -> str:
    """Return the stable message id of a saga's ``seq``-th command.

    Re-running the same input produces the same ids, so downstream consumers can deduplicate
    commands the relay publishes twice.
    """
    # A separator that cannot appear in ordinary ids keeps ("a-b", "c") and ("a", "b-c") apart.
    name = f"{saga_type}\x1f{saga_id}\x1f{seq}".encode()
    # uuid.uuid5(namespace, name), spelled out: one id per command makes building and then
    # formatting a uuid.UUID a visible share of a batch's planning time.
    sha = _COMMAND_ID_HASH.copy()
    sha.update(name)
    h = sha.hexdigest()
    # The version nibble becomes 5 and the variant bits 10, as text: no bytes to patch.
    return f"{h[:8]}-{h[8:12]}-5{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:32]}"


# A hex digit with its two high bits set to the RFC 4122 variant (10).
_VARIANT = {f"{n:x}": f"{(n & 0x3) | 0x8:x}" for n in range(16)}


# Not frozen: a frozen dataclass sets each field through object.__setattr__ (about 0.1 us a
# field), and one is built per handler run; nothing changes it once built.
@dataclass(slots=True)
class EventInput:
    """An event delivered to a saga.

    Attributes:
        message: The decoded event.
        metadata: Where it came from.
    """

    message: Message
    metadata: MessageMetadata


@dataclass(frozen=True)
class DeadlineInput:
    """A deadline that fired.

    Attributes:
        name: Deadline name.
        deadline_id: Store id of the deadline row.
        payload: JSON form of the payload given at scheduling, or None.
        due_at: When it was due.
    """

    name: str
    deadline_id: str
    payload: Any
    due_at: datetime


# Not frozen: a frozen dataclass sets each field through object.__setattr__ (about 0.1 us a
# field), and one is built per handler run; nothing changes it once built.
@dataclass(slots=True)
class Outcome:
    """What a handler invocation decided.

    Attributes:
        state: The new state (a copy; the input state is never mutated).
        commands: Commands to send, in order.
        deadlines: Deadline schedules and cancellations, in order.
        ended: Whether the saga ended; the store then cancels all its deadlines.
        handler_name: Name of the handler that ran.
        escalated: Why the saga now waits on a person (``SagaLifecycle.escalate``), if it does.
        outcome: How it ended, when ``ended`` and the saga said so
            (:class:`~processor.handles.SagaOutcome`); the engine counts an end without one
            as ``COMPLETED``.
    """

    state: SagaState
    commands: list[CommandIntent]
    deadlines: list[DeadlineOp]
    ended: bool
    handler_name: str
    outcome: str | None = None
    escalated: str | None = None


def waiting_on(state: SagaState, lifecycle: SagaLifecycle) -> str | None:
    """Why the saga waits on a person after a handler: its ``escalate`` call, or its state's say.

    An orchestrated saga keeps waiting on a person across handler runs (a reminder, a
    straggling reply) while its escalated step is undecided; its ``waiting_on()`` says so.
    """
    if lifecycle.escalated is not None:
        return lifecycle.escalated
    # Asked after every handler run: a missing attribute of a pydantic model costs a formatted
    # AttributeError, so the class's answer is kept.
    cls = type(state)
    ask = _WAITING_ON.get(cls, _UNKNOWN)
    if ask is _UNKNOWN:
        ask = _WAITING_ON[cls] = getattr(cls, "waiting_on", None)
    return ask(state) if callable(ask) else None


_UNKNOWN: Any = object()
_WAITING_ON: dict[type, Any] = {}


def state_to_json(state: SagaState) -> dict[str, Any]:
    """Return the JSON-compatible form of a saga's state."""
    # model_dump(mode="json") without its wrapper, which only forwards default arguments: this
    # runs once per saga and batch.
    out: dict[str, Any] = state.__pydantic_serializer__.to_python(state, mode="json")
    return out


class BoundSaga:
    """A saga definition with settings and dependencies resolved; runs handlers.

    Attributes:
        definition: The saga's definition.
        saga_type: The saga's type name.
        state_version: The version states are written at.
    """

    def __init__(
        self,
        definition: SagaDefinition,
        resolved: Mapping[str, tuple[ResolvedParam, ...]],
        registry: MessageRegistry,
        upcasters: StateUpcasters = state_upcasters,
    ) -> None:
        """Use :func:`bind` instead; it validates configuration first."""
        self.definition = definition
        self.saga_type = definition.saga_type
        self.state_version = definition.state_version
        self._upcasters = upcasters
        self._resolved = dict(resolved)
        # Per handler, worked out once: the injected constants (settings, dependencies), and
        # the other parameters by name and kind, filled per run.
        self._constants = {
            name: {p.param.name: p.value for p in params if p.constant}
            for name, params in self._resolved.items()
        }
        # The handles and the event by their place in the tuple each run builds; what is left
        # are deadline payloads, validated per run.
        self._slots = {
            name: tuple(
                (p.param.name, _SLOTS[p.param.kind])
                for p in params
                if not p.constant and p.param.kind in _SLOTS
            )
            for name, params in self._resolved.items()
        }
        self._payloads = {
            name: tuple(p for p in params if not p.constant and p.param.kind not in _SLOTS)
            for name, params in self._resolved.items()
        }
        self._registry = registry
        # State machines (processor.machine) expose their state for the queryable
        # `machine_state` column; the engine asks here, so it never imports that package.
        self._has_machine_state = hasattr(definition.state_cls, "machine_state")

    def machine_state(self, state: SagaState | None) -> str | None:
        """The state-machine state of ``state``, or None for sagas that are not machines."""
        if state is None or not self._has_machine_state:
            return None
        value = getattr(state, "machine_state", None)
        return str(value) if isinstance(value, Enum) else None

    def state_from_json(self, data: Mapping[str, Any], version: int | None = None) -> SagaState:
        """Load a stored state written at ``version`` (None: the current version).

        Raises:
            MissingUpcaster: No chain of upcasters leads from ``version`` to the current one.
            Exception: An upcaster raised, or the upcast state does not validate.
        """
        if version is not None and version != self.state_version:
            data = self._upcasters.apply(self.saga_type, data, version, self.state_version)
        return self.definition.state_cls.model_validate(data)

    def state_to_json(self, state: SagaState) -> dict[str, Any]:
        """Return the JSON-compatible form of ``state``."""
        return state_to_json(state)

    def handle_event(
        self, state: SagaState | None, saga_id: str, inp: EventInput, now: datetime
    ) -> Outcome:
        """Run the event's handler on a copy of ``state``.

        Args:
            state: Current state, or None when no instance exists yet.
            saga_id: The saga instance id (the event's association value).
            inp: The event and its metadata.
            now: Clock reading; deadlines scheduled ``after=`` count from it.

        Raises:
            SagaError: The saga has no handler for the event.
            SagaNotStarted: ``state`` is None and the handler is not a start handler.
            HandlerError: The handler raised.
        """
        handler = self.definition.event_handlers.get(type(inp.message))
        if handler is None:
            raise SagaError(
                f"saga {self.saga_type!r} has no handler for {type(inp.message).__qualname__}"
            )
        if state is None and not handler.start:
            raise SagaNotStarted(
                f"saga {self.saga_type!r} id {saga_id!r} does not exist and "
                f"{type(inp.message).__qualname__} does not start it"
            )
        return self._run(handler, state, saga_id, now, event=inp)

    def handle_deadline(
        self, state: SagaState, saga_id: str, inp: DeadlineInput, now: datetime
    ) -> Outcome:
        """Run the handler of a fired deadline on a copy of ``state``.

        Raises:
            SagaError: The saga has no handler for the deadline name.
            HandlerError: The handler raised, or the payload does not fit the declared type.
        """
        handler = self.definition.deadline_handlers.get(inp.name)
        if handler is None:
            raise SagaError(f"saga {self.saga_type!r} has no handler for deadline {inp.name!r}")
        return self._run(handler, state, saga_id, now, deadline=inp)

    def cancel_refusal(self, state: SagaState) -> str | None:
        """Why ``saga cancel`` cannot apply to this saga, or None when it can."""
        if CANCEL_HANDLER in self.definition.deadline_handlers:
            return None
        if callable(getattr(state, "operator_cancel", None)):
            return None
        return (
            "the saga declares no cancel path (@saga_cancel_handler), so nothing would be "
            "compensated; `saga terminate --force` ends it as it stands"
        )

    def handle_cancel(
        self,
        state: SagaState,
        saga_id: str,
        label: str,
        reason: str,
        now: datetime,
        by: str = "",
    ) -> Outcome:
        """Run the saga's cancel path: its ``@saga_cancel_handler``, or ``operator_cancel``.

        An orchestrated saga's ``operator_cancel(reason, commands, deadlines, lifecycle)``
        compensates what its steps did; a plain saga declares a cancel handler. Ask
        :meth:`cancel_refusal` first: a saga with neither is refused, not ended.

        Args:
            state: The current state.
            saga_id: The saga instance id.
            label: Recorded as the handler's name in the history (who asked, and why).
            reason: Passed to the saga's cancel path.
            now: Clock reading.
            by: Who asked.

        Raises:
            HandlerError: The cancel path raised.
        """
        handler = self.definition.deadline_handlers.get(CANCEL_HANDLER)
        if handler is not None:
            request = CancelRequest(reason=reason, by=by)
            outcome = self._run_operator_handler(handler, state, saga_id, label, request, now)
            if outcome.ended and outcome.outcome is None:
                # Ended by the cancel path without saying how: cancelled, not completed.
                outcome.outcome = SagaOutcome.CANCELLED
            return outcome
        return self._call_state(
            state,
            saga_id,
            label,
            now,
            "operator_cancel",
            lambda working, *handles: working.operator_cancel(reason, *handles),
        )

    def resolve_refusal(self, state: SagaState, decision: str) -> str | None:
        """Why the saga cannot take ``decision`` now (``saga resolve``), or None if it can."""
        if DECISION_HANDLER in self.definition.deadline_handlers:
            return None if decision.strip() else "say what was decided"
        refusal = getattr(state, "resolution_refusal", None)
        if not callable(refusal):
            return "the saga has no steps that wait on a person's decision"
        why = refusal(decision)
        return None if why is None else str(why)

    def handle_resolve(
        self,
        state: SagaState,
        saga_id: str,
        label: str,
        decision: str,
        reason: str,
        now: datetime,
        by: str = "",
    ) -> Outcome:
        """Apply an operator's decision (``saga resolve``).

        A plain saga runs its ``@saga_decision_handler``; an orchestrated saga its
        ``operator_resolve``, for its escalated step.

        Raises:
            HandlerError: The saga's resolve path raised.
        """
        handler = self.definition.deadline_handlers.get(DECISION_HANDLER)
        if handler is not None:
            request = DecisionRequest(decision=decision, reason=reason, by=by)
            return self._run_operator_handler(handler, state, saga_id, label, request, now)
        return self._call_state(
            state,
            saga_id,
            label,
            now,
            "operator_resolve",
            lambda working, *handles: working.operator_resolve(decision, reason, *handles),
        )

    def _run_operator_handler(
        self,
        handler: HandlerDef,
        state: SagaState,
        saga_id: str,
        label: str,
        request: BaseModel,
        now: datetime,
    ) -> Outcome:
        """Run a handler an operator's request selects, like a deadline's, under ``label``."""
        inp = DeadlineInput(str(handler.key), "", request.model_dump(), now)
        outcome = self._run(handler, state, saga_id, now, deadline=inp)
        outcome.handler_name = label
        return outcome

    def _call_state(
        self,
        state: SagaState,
        saga_id: str,
        label: str,
        now: datetime,
        name: str,
        call: Callable[..., object],
    ) -> Outcome:
        """Call a state method as handlers run: on a copy, validated after, failing as one.

        ``call(working, commands, deadlines, lifecycle)`` calls it; ``name`` names it in errors.
        """
        working = working_copy(state)
        commands = SagaCommands(saga_id, registry=self._registry)
        deadlines = SagaDeadlines(now)
        lifecycle = SagaLifecycle()
        try:
            call(working, commands, deadlines, lifecycle)
            working = self.definition.state_cls.model_validate(working.__dict__)
        except Exception as e:
            raise HandlerError(self.saga_type, saga_id, name, e) from e
        return Outcome(
            state=working,
            commands=commands.intents,
            deadlines=deadlines.operations,
            ended=lifecycle.ended,
            handler_name=label,
            outcome=lifecycle.outcome,
            escalated=None if lifecycle.ended else waiting_on(working, lifecycle),
        )

    def handle_terminate(self, state: SagaState, label: str) -> Outcome:
        """End the saga as it stands: no saga code runs, nothing is compensated."""
        return Outcome(
            state=state,
            commands=[],
            deadlines=[],
            ended=True,
            handler_name=label,
            outcome=SagaOutcome.TERMINATED,
        )

    def _run(
        self,
        handler: HandlerDef,
        state: SagaState | None,
        saga_id: str,
        now: datetime,
        *,
        event: EventInput | None = None,
        deadline: DeadlineInput | None = None,
    ) -> Outcome:
        state_cls = self.definition.state_cls
        if state is not None and not isinstance(state, state_cls):
            raise SagaError(f"state of saga {self.saga_type!r} must be a {state_cls.__qualname__}")
        # Handlers mutate ``self``; working on a deep copy means a handler that raises halfway
        # leaves the caller's state exactly as it was, ready for a retry.
        working = state_cls() if state is None else working_copy(state)
        commands = SagaCommands(saga_id, registry=self._registry)
        deadlines = SagaDeadlines(now)
        lifecycle = SagaLifecycle()
        try:
            name = handler.name
            kwargs: dict[str, Any] = dict(self._constants[name])
            # In _SLOTS order.
            values = (
                event.message if event else None,
                commands,
                deadlines,
                lifecycle,
                event.metadata if event else None,
            )
            for param, slot in self._slots[name]:
                kwargs[param] = values[slot]
            for p in self._payloads[name]:
                kwargs[p.param.name] = _payload(p, deadline)
            handler.func(working, **kwargs)
            # Re-validates every field the handler may have set (see SagaState); the validator
            # itself, as model_validate() calls it with default arguments.
            working = state_cls.__pydantic_validator__.validate_python(working.__dict__)
            self._check_deadline_names(deadlines.operations)
        except Exception as e:
            raise HandlerError(self.saga_type, saga_id, handler.name, e) from e
        ended = handler.end or lifecycle.ended
        return Outcome(
            state=working,
            commands=commands.intents,
            deadlines=deadlines.operations,
            ended=ended,
            handler_name=handler.name,
            outcome=lifecycle.outcome if ended else None,
            escalated=None if ended else waiting_on(working, lifecycle),
        )

    def _check_deadline_names(self, ops: list[DeadlineOp]) -> None:
        # Fail when the deadline is scheduled, not when it fires half an hour later with nobody
        # to handle it.
        for op in ops:
            if (
                isinstance(op, ScheduleDeadline)
                and op.name not in self.definition.deadline_handlers
            ):
                raise SagaError(
                    f"deadline {op.name!r} was scheduled but saga {self.saga_type!r} has no "
                    f"@saga_deadline_handler({op.name!r})"
                )


# Field values nothing can change in place: a working copy shares them with the original.
_IMMUTABLE = frozenset(
    {str, int, float, bool, Decimal, type(None), bytes, datetime, date, time, timedelta, uuid.UUID}
)
_new = object.__new__
_set = object.__setattr__
_S = TypeVar("_S", bound=SagaState)


def working_copy(state: _S) -> _S:
    """``state.model_copy(deep=True)``, sharing the field values nothing can change in place.

    Made once per handler run on a saga that exists: only containers and other mutable values
    are copied, through one memo, so two fields that share a list still share its copy (the
    transfer saga's state: 1.6 us, against 5.3 for pydantic's deep copy of every value). States
    with private attributes, extra fields or a deep copy of their own take pydantic's path.
    """
    cls = type(state)
    if (
        cls.__private_attributes__
        or state.__pydantic_extra__
        or cls.__deepcopy__ is not BaseModel.__deepcopy__
    ):
        return state.model_copy(deep=True)
    memo: dict[int, Any] = {}
    values = {
        k: v if type(v) in _IMMUTABLE else copy.deepcopy(v, memo) for k, v in state.__dict__.items()
    }
    new = _new(cls)
    _set(new, "__dict__", values)
    _set(new, "__pydantic_extra__", None)
    _set(new, "__pydantic_fields_set__", set(state.__pydantic_fields_set__))
    _set(new, "__pydantic_private__", None)
    return new


# What a handler run passes by parameter kind, by place in the tuple the run builds.
_SLOTS = {"event": 0, "commands": 1, "deadlines": 2, "lifecycle": 3, "metadata": 4}


def _payload(p: ResolvedParam, deadline: DeadlineInput | None) -> Any:
    raw = deadline.payload if deadline is not None else None
    if raw is None:
        if not p.param.optional:
            raise SagaError(
                f"deadline has no payload but parameter {p.param.name!r} requires one; give it "
                "a default or schedule the deadline with payload="
            )
        return None if p.param.default is NO_DEFAULT else p.param.default
    assert p.adapter is not None
    try:
        return p.adapter.validate_python(raw)
    except ValidationError as e:
        raise SagaError(
            f"deadline payload does not fit {p.param.name!r}: {e.error_count()} error(s)"
        ) from e


def bind(
    definition: SagaDefinition | type[SagaState],
    *,
    settings: Mapping[str, Any] | None = None,
    dependencies: Mapping[type, object] | None = None,
    registry: MessageRegistry = registry,
    upcasters: StateUpcasters = state_upcasters,
) -> BoundSaga:
    """Resolve every setting and dependency the saga's handlers ask for.

    Args:
        definition: A saga definition, or a class decorated with ``@saga``.
        settings: Values by key; dotted keys are also looked up through nested mappings.
        dependencies: Objects by type, injected into parameters annotated with that type.
        registry: Registry the saga's events and commands are declared in.
        upcasters: Registry of the saga's state upcasters; its chain must be gap-free.

    Raises:
        ConfigurationError: Lists every missing or invalid setting and dependency.
    """
    if not isinstance(definition, SagaDefinition):
        definition = definition_of(definition)
    problems: list[str] = []
    resolved: dict[str, tuple[ResolvedParam, ...]] = {}
    for handler in definition.handlers:
        resolved[handler.name] = resolve_handler(
            handler, settings or {}, dependencies or {}, problems
        )
    for event_cls in definition.event_handlers:
        if event_cls not in registry:
            problems.append(
                f"event {event_cls.__qualname__} is not registered, so it can never be decoded; "
                "decorate it with @message_type(...)"
            )
    problems.extend(upcasters.problems(definition.saga_type, definition.state_version))
    if problems:
        raise ConfigurationError(problems, subject=f"saga {definition.saga_type!r}")
    return BoundSaga(definition, resolved, registry, upcasters)


def bind_all(
    definitions: Iterable[SagaDefinition | type[SagaState]],
    *,
    settings: Mapping[str, Any] | None = None,
    dependencies: Mapping[type, object] | None = None,
    registry: MessageRegistry = registry,
    upcasters: StateUpcasters = state_upcasters,
) -> dict[str, BoundSaga]:
    """Bind several sagas, reporting every problem of every saga in one error.

    Returns:
        Bound sagas by saga type.

    Raises:
        ConfigurationError: Any saga failed to bind, or two sagas share a type name.
    """
    problems: list[str] = []
    bound: dict[str, BoundSaga] = {}
    for item in definitions:
        definition = item if isinstance(item, SagaDefinition) else definition_of(item)
        if definition.saga_type in bound:
            other = bound[definition.saga_type].definition.state_cls.__qualname__
            problems.append(
                f"sagas {other} and {definition.state_cls.__qualname__} share the type "
                f"{definition.saga_type!r}; give each a unique type"
            )
            continue
        try:
            bound[definition.saga_type] = bind(
                definition,
                settings=settings,
                dependencies=dependencies,
                registry=registry,
                upcasters=upcasters,
            )
        except ConfigurationError as e:
            problems.extend(f"saga {definition.saga_type!r}: {p}" for p in e.problems)
    if problems:
        raise ConfigurationError(problems)
    return bound
