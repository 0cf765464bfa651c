"""A saga definition bound for running: every handler's parameters resolved, handlers run pure.

Running a handler does no I/O: it returns the new state and the recorded intents, and the
engine persists them in one transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import ValidationError

from processor._authoring.binding import ResolvedParam
from processor._authoring.definition import (
    CancelRequest,
    DecisionRequest,
    HandlerDef,
    SagaDefinition,
    SagaState,
)
from processor._authoring.handles import (
    DeadlineOp,
    SagaCommands,
    SagaDeadlines,
    SagaLifecycle,
    SagaOutcome,
    ScheduleDeadline,
)
from processor._authoring.messages import MessageRegistry
from processor._authoring.params import NO_DEFAULT
from processor._authoring.upcasting import StateUpcasters, state_upcasters
from processor._errors import HandlerError, SagaError, SagaNotStarted
from processor._invocation.inputs import DeadlineInput, EventInput, Outcome
from processor._invocation.operator import (
    OperatorRequest,
    call_state,
    cancel_refusal,
    handler_name,
    resolve_refusal,
    state_method,
    terminated,
)
from processor._invocation.state import state_to_json, waiting_kind, waiting_on, working_copy

__all__ = ["BoundSaga"]


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
            name: tuple(
                p
                for p in params
                if not p.constant and p.param.kind not in _SLOTS and p.param.kind != "handles"
            )
            for name, params in self._resolved.items()
        }
        # Parameters taking the three handles in one object (``io: HandlerIo``), built per run.
        self._bundles = {
            name: tuple(
                (p.param.name, p.param.annotation) for p in params if p.param.kind == "handles"
            )
            for name, params in self._resolved.items()
        }
        self._registry = registry
        # State machines (processor._authoring.orchestration) expose their state for the queryable
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
        return cancel_refusal(self.definition, state)

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
        return self.handle_request(state, saga_id, label, CancelRequest(reason=reason, by=by), now)

    def resolve_refusal(self, state: SagaState, decision: str) -> str | None:
        """Why the saga cannot take ``decision`` now (``saga resolve``), or None if it can."""
        return resolve_refusal(self.definition, state, decision)

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
        request = DecisionRequest(decision=decision, reason=reason, by=by)
        return self.handle_request(state, saga_id, label, request, now)

    def handle_request(
        self,
        state: SagaState,
        saga_id: str,
        label: str,
        request: OperatorRequest,
        now: datetime,
    ) -> Outcome:
        """Run an operator's request: the saga's handler for it, or its state's method.

        :meth:`handle_cancel` and :meth:`handle_resolve` both come through here, so a subclass
        watching every operator run overrides this one method.

        Args:
            state: The current state.
            saga_id: The saga instance id.
            label: Recorded as the handler's name in the history (who asked, and why).
            request: What was asked, as the saga's handler is told it.
            now: Clock reading.

        Raises:
            HandlerError: The saga's path for the request raised.
        """
        handler = self.definition.deadline_handlers.get(handler_name(request))
        if handler is None:
            name, call = state_method(request)
            return call_state(
                self.definition, self._registry, state, saga_id, label, now, name, call
            )
        # Run like a deadline's handler, under ``label``.
        inp = DeadlineInput(str(handler.key), "", request.model_dump(), now)
        outcome = self._run(handler, state, saga_id, now, deadline=inp)
        outcome.handler_name = label
        if isinstance(request, CancelRequest) and outcome.ended and outcome.outcome is None:
            # Ended by the cancel path without saying how: cancelled, not completed.
            outcome.outcome = SagaOutcome.CANCELLED
        return outcome

    def handle_terminate(self, state: SagaState, label: str) -> Outcome:
        """End the saga as it stands: no saga code runs, nothing is compensated."""
        return terminated(state, label)

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
            for param, bundle in self._bundles[name]:
                kwargs[param] = bundle(commands, deadlines, lifecycle)
            handler.func(working, **kwargs)
            # Re-validates every field the handler may have set (see SagaState); the validator
            # itself, as model_validate() calls it with default arguments.
            working = state_cls.__pydantic_validator__.validate_python(working.__dict__)
            # Read once: each read of the property copies the list.
            operations = deadlines.operations
            self._check_deadline_names(operations)
        except Exception as e:
            raise HandlerError(self.saga_type, saga_id, handler.name, e) from e
        ended = handler.end or lifecycle.ended
        return Outcome(
            state=working,
            commands=commands.intents,
            deadlines=operations,
            ended=ended,
            handler_name=handler.name,
            outcome=lifecycle.outcome if ended else None,
            escalated=None if ended else waiting_on(working, lifecycle),
            escalation=None if ended else waiting_kind(working, lifecycle),
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
