"""Command factories learn their attempt; retry schedules and late windows come from settings."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Annotated, Any, ClassVar, Literal

import pytest

from processor import SagaCommands, SagaDeadlines, SagaLifecycle, Setting, saga, saga_event_handler
from processor._authoring.messages import Message, message_type
from processor._authoring.orchestration import (
    STEP_TIMER,
    Attempt,
    Escalation,
    MachineState,
    OrchestratedSaga,
    Orchestration,
    ReplyHandler,
    RetryPolicy,
    Step,
    on_decision,
    on_reply,
)
from processor._errors import ConfigurationError, HandlerError
from processor.testing import Result, SagaFixture
from schemas.orders import (
    EscalateToPerson,
    OrderPlaced,
    ReleaseStock,
    ReserveStock,
    StockReleased,
    StockReservationFailed,
    StockReserved,
)

OID = "o-1"
SLA = timedelta(minutes=10)
DECLARED = RetryPolicy(max_attempts=2, base_delay=timedelta(seconds=1))

ReserveRetry = Annotated[RetryPolicy, Setting("shop.reserve-retry", default=DECLARED)]
LateWindow = Annotated[timedelta, Setting("shop.late-window", default=timedelta(minutes=10))]


def _reserve(order: Any, attempt: Attempt) -> Message:
    # The attempt travels in the command (as the quantity, the budget left as the amount) so
    # the test reads what the factory was told.
    left = attempt.remaining.total_seconds() if attempt.remaining is not None else -1
    return ReserveStock(
        order_id=order.order_id,
        customer_id="c",
        sku="s",
        quantity=attempt.number,
        amount=Decimal(int(left)),
    )


def _release(order: Any) -> Message:
    return ReleaseStock(order_id=order.order_id, customer_id="c", sku="s", quantity=1, amount=1)


def _escalate(order: Any, escalation: Escalation) -> Message:
    return EscalateToPerson(order_id=order.order_id, **escalation.model_dump())


@saga(type="shop-saga")
class Shop(OrchestratedSaga):
    orchestration = Orchestration(
        steps=(
            Step(
                "reserve",
                action=_reserve,
                compensation=_release,
                timeout=timedelta(seconds=30),
                idempotent=True,
                retry=DECLARED,
                late_success="undo",
            ),
        ),
        escalation=_escalate,
        sla=SLA,
    )
    order_id: str = ""

    @saga_event_handler(OrderPlaced, association_property="order_id", start=True)
    def on_placed(
        self,
        event: OrderPlaced,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        retry: ReserveRetry,
        late_window: LateWindow,
    ) -> None:
        self.order_id = event.order_id
        self.begin(
            event.order_id,
            commands,
            deadlines,
            lifecycle,
            retries={"reserve": retry},
            late_windows={"reserve": late_window},
        )

    on_reserved: ClassVar[ReplyHandler] = on_reply(
        StockReserved, step="reserve", association_property="order_id"
    )
    on_failed: ClassVar[ReplyHandler] = on_reply(
        StockReservationFailed, step="reserve", kind="failed", association_property="order_id"
    )
    on_released: ClassVar[ReplyHandler] = on_reply(
        StockReleased, step="reserve", kind="undone", association_property="order_id"
    )


def _placed() -> OrderPlaced:
    return OrderPlaced(order_id=OID, customer_id="c", sku="s", quantity=1, amount=Decimal(1))


def _sent(r: Result) -> ReserveStock:
    sent = r.commands[-1]
    assert isinstance(sent, ReserveStock)
    return sent


FOUR_TRIES = {
    "max_attempts": 4,
    "base_delay": "PT10S",
    "max_delay": "PT10S",
    "jitter": 0,
}


def test_a_factory_gets_its_attempt_number_and_the_budget_left() -> None:
    f = SagaFixture(Shop, settings={"shop.reserve-retry": FOUR_TRIES})
    sent = _sent(f.when(_placed()))
    assert (sent.quantity, sent.amount) == (1, Decimal(600))
    for attempt in (2, 3, 4):
        f.when(StockReservationFailed(order_id=OID, reason="busy"))
        sent = _sent(f.when_time_elapses(timedelta(seconds=10)))
        left = SLA - timedelta(seconds=10) * (attempt - 1)
        assert (sent.quantity, sent.amount) == (attempt, Decimal(left.seconds))
    # The fourth failure exhausts the schedule the setting gave (the declared one allows two).
    f.when(StockReservationFailed(order_id=OID, reason="busy"))
    assert isinstance(f.state, Shop)
    assert f.state.machine_state == MachineState.FAILED


def test_the_declared_schedule_applies_without_the_setting() -> None:
    f = SagaFixture(Shop)
    f.when(_placed())
    f.when(StockReservationFailed(order_id=OID, reason="busy"))
    assert _sent(f.when_time_elapses(timedelta(seconds=1))).quantity == 2
    f.when(StockReservationFailed(order_id=OID, reason="busy"))
    assert isinstance(f.state, Shop)
    assert f.state.machine_state == MachineState.FAILED


def test_the_late_window_comes_from_settings() -> None:
    f = SagaFixture(Shop, settings={"shop.late-window": "PT3M", "shop.reserve-retry": {}})
    f.when(_placed())
    # No reply in time: the outcome is unknown, so compensation listens for a late success.
    r = f.when_time_elapses(timedelta(seconds=30))
    assert r.pending[STEP_TIMER] == f.now + timedelta(minutes=3)
    f.when_time_elapses(timedelta(minutes=3))
    assert isinstance(f.state, Shop)
    assert f.state.machine_state == MachineState.FAILED


def test_an_invalid_retry_setting_is_reported_with_its_reason() -> None:
    with pytest.raises(ConfigurationError, match="max_attempts must be >= 1, got 0"):
        SagaFixture(Shop, settings={"shop.reserve-retry": {"max_attempts": 0}})


def test_retries_for_a_step_that_is_not_idempotent_are_refused() -> None:
    @saga(type="unsafe-retry")
    class Unsafe(Shop):
        orchestration = Orchestration(
            steps=(Step("reserve", action=_reserve, compensation=_release),),
            escalation=_escalate,
        )

    f = SagaFixture(Unsafe, settings={"shop.reserve-retry": FOUR_TRIES})
    with pytest.raises(HandlerError, match="retries for steps that are not idempotent"):
        f.when(_placed())


@message_type("tests.ShopDecision", topic="tests.shop-events")
class ShopDecision(Message):
    """A person's decision on the shop saga's escalated step."""

    order_id: str
    decision: Literal["retry", "skip", "compensate"]
    reason: str = ""


@saga(type="escalating-shop")
class EscalatingShop(Shop):
    orchestration = Orchestration(
        steps=(
            Step(
                "reserve",
                action=_reserve,
                compensation=_release,
                timeout=timedelta(seconds=30),
                idempotent=True,
                retry=DECLARED,
                on_exhausted="escalate",
                escalation_timeout=timedelta(minutes=1),
            ),
        ),
        escalation=_escalate,
        sla=SLA,
        on_saga_timeout="fail",
    )
    on_decided: ClassVar[ReplyHandler] = on_decision(ShopDecision, association_property="order_id")


def _escalated() -> SagaFixture:
    f = SagaFixture(EscalatingShop)
    f.when(_placed())
    f.when(StockReservationFailed(order_id=OID, reason="busy"))
    f.when_time_elapses(timedelta(seconds=1))
    r = f.when(StockReservationFailed(order_id=OID, reason="busy"))
    assert [type(c) for c in r.commands] == [EscalateToPerson]
    assert isinstance(f.state, Shop)
    assert f.state.machine_state == MachineState.WAITING
    return f


def test_a_decision_event_resumes_an_escalated_step() -> None:
    f = _escalated()
    r = f.when(ShopDecision(order_id=OID, decision="retry", reason="stock arrived"))
    assert _sent(r).quantity == 1  # a fresh schedule starts at attempt 1
    f.when(StockReserved(order_id=OID)).expect_ended("COMPLETED")
    assert isinstance(f.state, Shop)
    assert f.state.machine_state == MachineState.COMPLETED
    # A second decision for the same step comes too late and changes nothing.
    f.when(ShopDecision(order_id=OID, decision="skip"))


def test_a_duplicate_decision_is_recorded_and_ignored() -> None:
    f = _escalated()
    f.when(ShopDecision(order_id=OID, decision="retry"))
    f.when(ShopDecision(order_id=OID, decision="retry")).expect_no_commands()
    assert isinstance(f.state, EscalatingShop)
    assert f.state.progress.late == ["decision:retry-ignored"]
    assert f.state.machine_state == MachineState.RUNNING
    assert f.state.progress.attempt == 1


def test_the_fail_policy_stops_without_undoing_anything() -> None:
    f = _escalated()
    # Nobody decides before the saga deadline: the saga fails and nothing is undone.
    r = f.when_time_elapses(SLA)
    assert [c.reason for c in r.commands if isinstance(c, EscalateToPerson)] == [
        "still-waiting"
    ] * 9
    assert not any(isinstance(c, ReleaseStock) for c in r.commands)
    r.expect_ended("TIMED_OUT").expect_no_deadlines()
    assert isinstance(f.state, EscalatingShop)
    assert f.state.machine_state == MachineState.FAILED
    assert [t.target for t in f.state.machine.transitions][-2:] == [
        MachineState.TIMED_OUT,
        MachineState.FAILED,
    ]


@message_type("tests.StockServiceBusy", topic="tests.shop-events")
class StockServiceBusy(Message):
    """The stock service's breaker is open: it did not run the command."""

    order_id: str


@saga(type="breaker-shop")
class BreakerShop(Shop):
    on_busy: ClassVar[ReplyHandler] = on_reply(
        StockServiceBusy, step="reserve", kind="unavailable", association_property="order_id"
    )


def test_an_open_breaker_waits_without_spending_retries() -> None:
    f = SagaFixture(BreakerShop)
    f.when(_placed())
    for _ in range(5):
        f.when(StockServiceBusy(order_id=OID)).expect_no_commands()
        # The same attempt again after the step's breaker wait (30 s): no retry spent.
        assert _sent(f.when_time_elapses(timedelta(seconds=30))).quantity == 1
    assert isinstance(f.state, Shop)
    assert (f.state.progress.attempt, f.state.progress.breaker_waits) == (1, 5)
    # Its real retry is still there: one failure is retried, as the declared schedule says.
    f.when(StockReservationFailed(order_id=OID, reason="busy"))
    assert _sent(f.when_time_elapses(timedelta(seconds=1))).quantity == 2
    f.when(StockReserved(order_id=OID)).expect_ended("COMPLETED")


def test_the_saga_deadline_bounds_waiting_out_a_breaker() -> None:
    f = SagaFixture(BreakerShop)
    f.when(_placed())
    for _ in range(20):  # ten minutes of an open breaker: the saga's whole budget
        f.when(StockServiceBusy(order_id=OID))
        f.when_time_elapses(timedelta(seconds=30))
    assert isinstance(f.state, Shop)
    assert f.state.progress.timed_out
    assert MachineState.TIMED_OUT in [t.target for t in f.state.machine.transitions]
    assert f.state.machine_state == MachineState.COMPENSATING
    # The breaker no longer matters: the step was given up.
    f.when(StockServiceBusy(order_id=OID)).expect_no_commands()
    assert f.state.progress.late[-1:] == ["reserve:unavailable-ignored"]
