"""Declared transitions, illegal ones rejected in the handler, and the static analysis."""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

import pytest

from processor import (
    HandlerError,
    IllegalTransition,
    SagaDeadlines,
    SagaDefinitionError,
    saga,
    saga_event_handler,
)
from processor._authoring.orchestration import (
    MachineSaga,
    MachineSpec,
    MachineState,
    Orchestration,
    RetryPolicy,
    Step,
    Transitions,
    lint,
    machine_state_of,
    mermaid,
)
from processor.testing import SagaFixture
from sagas.order import OrderSaga
from sagas.transfer import TransferSaga
from schemas.orders import OrderPlaced, ReserveStock, StockReserved

S = MachineState
APPROVALS = Transitions.of({S.NEW: {S.WAITING}, S.WAITING: {S.COMPLETED}})


@saga(type="approval-test")
class Approval(MachineSaga):
    """A hand-written machine: NEW -> WAITING -> COMPLETED, nothing else."""

    machine_transitions: ClassVar[Transitions] = APPROVALS
    order_id: str = ""

    @saga_event_handler(OrderPlaced, association_property="order_id", start=True)
    def on_placed(self, event: OrderPlaced, deadlines: SagaDeadlines) -> None:
        self.order_id = event.order_id
        self.transition_to(S.WAITING, deadlines.now, "asked a person")

    @saga_event_handler(StockReserved, association_property="order_id")
    def on_reserved(self, event: StockReserved, deadlines: SagaDeadlines) -> None:
        # Not declared: WAITING may only go to COMPLETED.
        self.transition_to(S.FAILED, deadlines.now, "bug")


def _placed() -> OrderPlaced:
    return OrderPlaced(order_id="a", customer_id="c", sku="s", quantity=1, amount="1.00")


def test_declared_transition_is_recorded_with_its_reason() -> None:
    f = SagaFixture(Approval)
    r = f.when(_placed())
    assert machine_state_of(r.state) == "WAITING"
    state = f.state
    assert isinstance(state, Approval)
    [t] = state.machine.transitions
    assert (t.source, t.target, t.at, t.reason) == (S.NEW, S.WAITING, f.now, "asked a person")


def test_illegal_transition_raises_inside_the_handler_and_changes_nothing() -> None:
    f = SagaFixture(Approval)
    f.when(_placed())
    with pytest.raises(HandlerError) as info:
        f.when(StockReserved(order_id="a"))
    assert isinstance(info.value.cause, IllegalTransition)
    assert "WAITING -> FAILED" in str(info.value.cause)
    assert machine_state_of(f.state) == "WAITING"


def test_plain_sagas_have_no_machine_state() -> None:
    assert machine_state_of(TransferSaga()) is None
    assert machine_state_of(None) is None


def test_terminal_states_cannot_declare_outgoing_transitions() -> None:
    with pytest.raises(SagaDefinitionError, match="COMPLETED is terminal"):
        Transitions.of({S.NEW: {S.COMPLETED}, S.COMPLETED: {S.RUNNING}})


def test_orchestration_rejects_retries_of_non_idempotent_steps() -> None:
    def cmd(_: object) -> ReserveStock:
        raise AssertionError

    with pytest.raises(SagaDefinitionError) as info:
        Orchestration(
            steps=(
                Step("a", cmd, retry=RetryPolicy(max_attempts=3)),
                Step("a", cmd, late_success="undo"),
            ),
            escalation=lambda s, e: cmd(s),
        )
    text = str(info.value)
    assert "not idempotent" in text
    assert "unique" in text
    assert "needs a compensation" in text


def test_lint_finds_unreachable_untimed_waiting_and_lingering_terminal() -> None:
    spec = MachineSpec(
        name="bad",
        transitions=Transitions.of(
            {S.NEW: {S.WAITING}, S.WAITING: {S.COMPLETED, S.FAILED}, S.TIMED_OUT: {S.FAILED}}
        ),
        timers={S.NEW: frozenset({"t"})},
        ending=frozenset({S.COMPLETED}),
    )
    problems = lint(spec)
    assert any("TIMED_OUT is unreachable" in p for p in problems)
    assert any("WAITING has no timer" in p for p in problems)
    assert any("terminal state FAILED does not end the saga" in p for p in problems)
    assert len(problems) == 3


def test_order_saga_lints_clean_and_draws_every_state() -> None:
    spec = OrderSaga.machine_spec()
    assert lint(spec) == []
    text = mermaid(spec)
    assert text.startswith("stateDiagram-v2\n")
    assert "    [*] --> NEW\n" in text
    assert "    WAITING --> TIMED_OUT\n" in text
    assert "    COMPENSATED --> [*]\n" in text
    # An undo out of retries waits on a person: the orchestrator never ends COMPENSATION_FAILED.
    assert "    COMPENSATING --> WAITING\n" in text
    assert "COMPENSATION_FAILED" not in text
    for state in MachineState:
        if state != MachineState.COMPENSATION_FAILED:
            assert state.value in text


def test_cli_diagram_and_lint(capsys: pytest.CaptureFixture[str]) -> None:
    from processor._cli import main

    assert main(["diagram", "sagas.order:OrderSaga"]) == 0
    assert capsys.readouterr().out == mermaid(OrderSaga.machine_spec())
    assert main(["lint-saga", "sagas.order:OrderSaga"]) == 0
    assert "no problems" in capsys.readouterr().out
    assert main(["lint-saga", "sagas.transfer:TransferSaga"]) == 2
    assert "not a state machine saga" in capsys.readouterr().err


def test_step_timeouts_from_settings_are_stored_for_later_handlers() -> None:
    f = SagaFixture(OrderSaga, settings={"order.payment-timeout": timedelta(minutes=1)})
    f.when(_placed())
    state = f.state
    assert isinstance(state, OrderSaga)
    assert state.progress.timeouts["pay"] == timedelta(minutes=1)
