"""Operator requests to a bound saga (``saga cancel``, ``saga resolve``, ``saga terminate``).

A plain saga answers a request with the handler it declares for it (``@saga_cancel_handler``,
``@saga_decision_handler``), run like a deadline's; an orchestrated saga with a method of its
state (``operator_cancel``, ``operator_resolve``), run here as handlers are run.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from processor._authoring.definition import (
    CANCEL_HANDLER,
    DECISION_HANDLER,
    CancelRequest,
    DecisionRequest,
    SagaDefinition,
    SagaState,
)
from processor._authoring.handles import SagaCommands, SagaDeadlines, SagaLifecycle, SagaOutcome
from processor._authoring.messages import MessageRegistry
from processor._errors import HandlerError
from processor._invocation.inputs import Outcome
from processor._invocation.state import waiting_on, working_copy

__all__ = [
    "OperatorRequest",
    "call_state",
    "cancel_refusal",
    "handler_name",
    "resolve_refusal",
    "state_method",
    "terminated",
]

OperatorRequest = CancelRequest | DecisionRequest
"""An operator's request to a saga, as its handler is told it."""


def handler_name(request: OperatorRequest) -> str:
    """The name the handler of ``request`` is kept under among the deadline handlers."""
    return CANCEL_HANDLER if isinstance(request, CancelRequest) else DECISION_HANDLER


def cancel_refusal(definition: SagaDefinition, state: SagaState) -> str | None:
    """Why ``saga cancel`` cannot apply to this saga, or None when it can."""
    if CANCEL_HANDLER in definition.deadline_handlers:
        # A saga function knows when a cancel has nothing to act on (it is compensating).
        ask = getattr(state, "cancel_refusal", None)
        why = ask() if callable(ask) else None
        return None if why is None else str(why)
    if callable(getattr(state, "operator_cancel", None)):
        return None
    return (
        "the saga declares no cancel path (@saga_cancel_handler), so nothing would be "
        "compensated; `saga terminate --force` ends it as it stands"
    )


def resolve_refusal(definition: SagaDefinition, state: SagaState, decision: str) -> str | None:
    """Why the saga cannot take ``decision`` now (``saga resolve``), or None if it can."""
    if DECISION_HANDLER in definition.deadline_handlers:
        # A saga function knows whether it waits on a person at all.
        ask = getattr(state, "decision_refusal", None)
        if callable(ask):
            why = ask(decision)
            return None if why is None else str(why)
        return None if decision.strip() else "say what was decided"
    refusal = getattr(state, "resolution_refusal", None)
    if not callable(refusal):
        return "the saga has no steps that wait on a person's decision"
    why = refusal(decision)
    return None if why is None else str(why)


def state_method(request: OperatorRequest) -> tuple[str, Callable[..., object]]:
    """The state method answering ``request`` in a saga without a handler for it.

    Returns:
        Its name, for errors, and ``call(working, commands, deadlines, lifecycle)`` calling it.
    """
    if isinstance(request, CancelRequest):
        reason = request.reason
        return "operator_cancel", lambda working, *handles: working.operator_cancel(
            reason, *handles
        )
    decision = request.decision
    why = request.reason
    return "operator_resolve", lambda working, *handles: working.operator_resolve(
        decision, why, *handles
    )


def call_state(
    definition: SagaDefinition,
    registry: MessageRegistry,
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
    commands = SagaCommands(saga_id, registry=registry)
    deadlines = SagaDeadlines(now)
    lifecycle = SagaLifecycle()
    try:
        call(working, commands, deadlines, lifecycle)
        working = definition.state_cls.model_validate(working.__dict__)
    except Exception as e:
        raise HandlerError(definition.saga_type, saga_id, name, e) from e
    return Outcome(
        state=working,
        commands=commands.intents,
        deadlines=deadlines.operations,
        ended=lifecycle.ended,
        handler_name=label,
        outcome=lifecycle.outcome,
        escalated=None if lifecycle.ended else waiting_on(working, lifecycle),
    )


def terminated(state: SagaState, label: str) -> Outcome:
    """The saga ended as it stands: no saga code runs, nothing is compensated."""
    return Outcome(
        state=state,
        commands=[],
        deadlines=[],
        ended=True,
        handler_name=label,
        outcome=SagaOutcome.TERMINATED,
    )
