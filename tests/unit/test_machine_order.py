"""The order saga through every orchestrator path, in memory with virtual time."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal

import pytest

from processor._authoring.messages import Message
from processor._authoring.orchestration import (
    SAGA_DEADLINE,
    STEP_TIMER,
    MachineState,
    Orchestration,
    Step,
    mermaid,
)
from processor._errors import SagaDefinitionError
from processor._invocation import state_to_json
from processor.testing import SagaFixture
from sagas.order import OrderSaga
from schemas.orders import (
    CapturePayment,
    EscalateToPerson,
    FraudReviewApproved,
    FraudReviewRejected,
    OrderPlaced,
    OrderShipped,
    PaymentCaptured,
    PaymentDeclined,
    PaymentRefunded,
    RefundFailed,
    RefundPayment,
    ReleaseStock,
    RequestFraudReview,
    ReserveStock,
    ShipmentFailed,
    ShipOrder,
    StockReleased,
    StockReservationFailed,
    StockReserved,
    StockUnavailable,
)

OID = "o-1"
FACTS = {"order_id": OID, "customer_id": "c-1", "sku": "sku-1", "quantity": 2}
AMOUNT = Decimal("19.99")
S = MachineState


def _placed() -> OrderPlaced:
    return OrderPlaced(**FACTS, amount=AMOUNT)


def _cmd(cls: Callable[..., Message]) -> Message:
    return cls(**FACTS, amount=AMOUNT)


def _state(fixture: SagaFixture) -> OrderSaga:
    state = fixture.state
    assert isinstance(state, OrderSaga)
    return state


def _paid(fixture: SagaFixture) -> None:
    fixture.when(_placed())
    fixture.when(StockReserved(order_id=OID))
    fixture.when(PaymentCaptured(order_id=OID))


def _trail(fixture: SagaFixture) -> list[tuple[str, str]]:
    return [(t.source.value, t.target.value) for t in _state(fixture).machine.transitions]


def test_happy_path_runs_every_step_in_order_and_completes() -> None:
    f = SagaFixture(OrderSaga)
    f.when(_placed()).expect_commands(_cmd(ReserveStock))
    assert _state(f).machine_state == S.RUNNING
    f.when(StockReserved(order_id=OID)).expect_commands(_cmd(CapturePayment))
    f.when(PaymentCaptured(order_id=OID)).expect_commands(_cmd(RequestFraudReview))
    assert _state(f).machine_state == S.WAITING
    f.when(FraudReviewApproved(order_id=OID)).expect_commands(_cmd(ShipOrder))
    assert _state(f).machine_state == S.RUNNING
    f.when(OrderShipped(order_id=OID)).expect_no_commands().expect_ended(
        "COMPLETED"
    ).expect_no_deadlines()
    assert _state(f).machine_state == S.COMPLETED
    assert _state(f).progress.completed == ["reserve", "pay", "fraud-review", "ship"]
    assert _trail(f) == [
        ("NEW", "RUNNING"),
        ("RUNNING", "WAITING"),
        ("WAITING", "RUNNING"),
        ("RUNNING", "COMPLETED"),
    ]


def test_commands_carry_the_remaining_budget() -> None:
    f = SagaFixture(OrderSaga)
    start = f.now
    r = f.when(_placed())
    # Reserve: its own 30 s timeout is sooner than the two-day saga deadline.
    assert r.command_intents[0].deadline_unix_ms == int(
        (start + timedelta(seconds=30)).timestamp() * 1000
    )
    r.expect_deadline_scheduled(SAGA_DEADLINE, at=start + timedelta(days=2))
    r.expect_deadline_scheduled(STEP_TIMER, after=timedelta(seconds=30))


def test_step_retry_then_success() -> None:
    f = SagaFixture(OrderSaga)
    f.when(_placed())
    r = f.when(StockReservationFailed(order_id=OID, reason="busy")).expect_no_commands()
    retry_at = r.pending[STEP_TIMER]
    # Jittered within [ (1 - jitter) * base, base ] of the first backoff (2 s).
    assert timedelta(seconds=1) <= retry_at - f.now <= timedelta(seconds=2)
    f.when_time_elapses(timedelta(seconds=2)).expect_commands(_cmd(ReserveStock))
    assert _state(f).progress.attempt == 2
    f.when(StockReserved(order_id=OID)).expect_commands(_cmd(CapturePayment))
    assert _state(f).machine_state == S.RUNNING


def _shipping_escalated(f: SagaFixture) -> None:
    _paid(f)
    f.when(FraudReviewApproved(order_id=OID))
    # Ship tries 5 times, each timing out after an hour, then a person is asked.
    r = f.when_time_elapses(timedelta(hours=6))
    assert r.commands.count(_cmd(ShipOrder)) == 4
    assert r.commands[-1] == EscalateToPerson(
        order_id=OID,
        reason="retries-exhausted",
        step="ship",
        machine_state="WAITING",
        detail="step ship timed out",
    )
    assert _state(f).machine_state == S.WAITING
    assert _state(f).progress.escalated == "ship"
    # Operators see why it waits, in the row's reason, as for a plain saga's escalate().
    assert r.waiting == "step ship timed out"


def test_shipping_retries_exhausted_escalate_to_a_person_not_a_refund() -> None:
    f = SagaFixture(OrderSaga)
    _shipping_escalated(f)
    # Nobody decides for a day: the person is reminded, and the saga keeps waiting.
    r = f.when_time_elapses(timedelta(days=1))
    reminders = [c.reason for c in r.commands if isinstance(c, EscalateToPerson)]
    assert reminders == ["still-waiting"]
    assert r.waiting == "step ship timed out"  # still waiting after the reminder
    assert RefundPayment not in {type(c) for c in r.commands}
    assert _state(f).machine_state == S.WAITING
    # A straggling failure of an earlier attempt changes nothing while a person decides.
    f.when(ShipmentFailed(order_id=OID, reason="carrier down")).expect_no_commands()
    assert _state(f).progress.late == ["ship:failed-while-escalated"]


def test_an_operator_decides_to_compensate_an_escalated_step() -> None:
    f = SagaFixture(OrderSaga)
    _shipping_escalated(f)
    f.when_resolved("compensate", "carrier gone for good").expect_commands(_cmd(RefundPayment))
    assert _state(f).machine_state == S.COMPENSATING
    f.when(PaymentRefunded(order_id=OID)).expect_commands(_cmd(ReleaseStock))
    f.when(StockReleased(order_id=OID)).expect_ended("COMPENSATED").expect_no_deadlines()
    assert _state(f).machine_state == S.COMPENSATED
    assert _state(f).progress.undone == ["pay", "reserve"]
    assert _state(f).progress.reason == "step ship: compensate decided: carrier gone for good"


def test_an_operator_decides_to_retry_an_escalated_step() -> None:
    f = SagaFixture(OrderSaga)
    _shipping_escalated(f)
    f.when_resolved("retry", "carrier is back").expect_commands(_cmd(ShipOrder))
    assert _state(f).machine_state == S.RUNNING
    # A fresh schedule: one failure is retried again rather than escalated at once.
    f.when(ShipmentFailed(order_id=OID, reason="busy")).expect_no_commands()
    assert f.when_time_elapses(timedelta(minutes=1)).commands == [_cmd(ShipOrder)]
    f.when(OrderShipped(order_id=OID)).expect_ended("COMPLETED").expect_no_deadlines()
    assert _state(f).machine_state == S.COMPLETED


def test_an_operator_decides_to_skip_an_escalated_step() -> None:
    f = SagaFixture(OrderSaga)
    _shipping_escalated(f)
    f.when_resolved("skip", "shipped by hand").expect_no_commands().expect_ended("COMPLETED")
    assert _state(f).machine_state == S.COMPLETED
    assert _state(f).progress.skipped == ["ship"]


def test_a_decision_nothing_waits_for_is_refused() -> None:
    f = SagaFixture(OrderSaga)
    _paid(f)
    with pytest.raises(AssertionError, match="no step of this saga waits on a person"):
        f.when_resolved("skip")


def test_cancel_releases_the_stock_and_refunds_the_payment() -> None:
    f = SagaFixture(OrderSaga)
    _paid(f)
    f.when_cancelled("customer changed their mind").expect_commands(_cmd(RefundPayment))
    f.when(PaymentRefunded(order_id=OID)).expect_commands(_cmd(ReleaseStock))
    f.when(StockReleased(order_id=OID)).expect_ended("CANCELLED").expect_no_deadlines()
    assert _state(f).progress.undone == ["pay", "reserve"]


def test_terminate_ends_the_saga_and_undoes_nothing() -> None:
    f = SagaFixture(OrderSaga)
    _paid(f)
    f.when_terminated("test order").expect_no_commands().expect_ended(
        "TERMINATED"
    ).expect_no_deadlines()
    with pytest.raises(AssertionError, match="ignored-ended"):
        f.when_cancelled()


def test_business_refusal_is_not_retried() -> None:
    f = SagaFixture(OrderSaga)
    f.when(_placed())
    f.when(StockUnavailable(order_id=OID, reason="sold out")).expect_no_commands().expect_ended(
        "FAILED"
    )
    assert _state(f).machine_state == S.FAILED
    assert _trail(f) == [("NEW", "RUNNING"), ("RUNNING", "FAILED")]


def _refund_escalated(f: SagaFixture) -> None:
    """The refund fails past its undo retries: a person is asked, the saga WAITING."""
    _paid(f)
    f.when(FraudReviewRejected(order_id=OID, reason="stolen card")).expect_commands(
        _cmd(RefundPayment)
    )
    sent = 1
    for _ in range(4):
        f.when(RefundFailed(order_id=OID, reason="provider down")).expect_no_commands()
        # The undo's own backoff, not capped by the saga budget.
        sent += f.when_time_elapses(timedelta(minutes=5)).commands.count(_cmd(RefundPayment))
    assert sent == 5
    r = f.when(RefundFailed(order_id=OID, reason="provider down"))
    assert r.commands == [
        EscalateToPerson(
            order_id=OID,
            reason="compensation-failed",
            step="pay",
            machine_state="WAITING",
            detail="undo of pay failed: provider down",
        )
    ]
    # Not ended: the saga waits on the person, who may act on it with `saga resolve`.
    r.expect_active()
    assert r.waiting == "undo of pay failed: provider down"
    assert _state(f).machine_state == S.WAITING
    assert _state(f).progress.state == "CHARGING_UNDO_ESCALATED"
    assert _state(f).progress.undo_escalated == "pay"
    # The stock release has not run: compensation is paused on the failed refund.
    assert _state(f).progress.undo_queue == ["pay", "reserve"]
    assert _trail(f)[-2:] == [("WAITING", "COMPENSATING"), ("COMPENSATING", "WAITING")]


def test_an_undo_out_of_retries_waits_on_a_person_and_is_reminded() -> None:
    f = SagaFixture(OrderSaga)
    _refund_escalated(f)
    # Nobody decides for a day: reminded; the saga deadline (two days) passing changes nothing.
    r = f.when_time_elapses(timedelta(days=3))
    assert [c.reason for c in r.commands if isinstance(c, EscalateToPerson)] == [
        "still-waiting"
    ] * 3
    assert r.fired.count(SAGA_DEADLINE) == 1
    r.expect_active()
    assert r.waiting == "undo of pay failed: provider down"
    assert _state(f).machine_state == S.WAITING
    # Neither a cancel nor a straggling failure of the refund moves it.
    f.when_cancelled("customer asks").expect_no_commands().expect_active()
    f.when(RefundFailed(order_id=OID, reason="late")).expect_no_commands()
    assert _state(f).progress.late == ["pay:undo-failed-while-escalated"]
    assert _state(f).progress.timed_out is False
    assert _state(f).progress.cancelled is False


def test_a_person_retries_an_escalated_undo() -> None:
    f = SagaFixture(OrderSaga)
    _refund_escalated(f)
    r = f.when_resolved("retry", "provider is back")
    r.expect_commands(_cmd(RefundPayment)).expect_active()
    assert r.waiting is None
    assert _state(f).machine_state == S.COMPENSATING
    assert _state(f).progress.undo_escalated is None
    assert _state(f).progress.state == "CHARGING_UNDO"
    # A fresh undo schedule: one failure is retried again rather than escalated at once.
    f.when(RefundFailed(order_id=OID, reason="blip")).expect_no_commands()
    assert f.when_time_elapses(timedelta(seconds=5)).commands == [_cmd(RefundPayment)]
    f.when(PaymentRefunded(order_id=OID)).expect_commands(_cmd(ReleaseStock))
    f.when(StockReleased(order_id=OID)).expect_ended("COMPENSATED").expect_no_deadlines()
    assert _state(f).machine_state == S.COMPENSATED
    assert _state(f).progress.undone == ["pay", "reserve"]
    assert _state(f).progress.undone_by_hand == []


def test_a_person_skips_an_escalated_undo_and_compensation_goes_on() -> None:
    f = SagaFixture(OrderSaga)
    _refund_escalated(f)
    # Refunded by hand: the earlier step's undo (the stock release) runs next.
    f.when_resolved("skip", "refunded by bank transfer").expect_commands(_cmd(ReleaseStock))
    assert _state(f).machine_state == S.COMPENSATING
    assert _state(f).progress.undo_queue == ["reserve"]
    f.when(StockReleased(order_id=OID)).expect_ended("COMPENSATED").expect_no_deadlines()
    assert _state(f).progress.undone == ["pay", "reserve"]
    assert _state(f).progress.undone_by_hand == ["pay"]
    assert _trail(f)[-3:] == [
        ("COMPENSATING", "WAITING"),
        ("WAITING", "COMPENSATING"),
        ("COMPENSATING", "COMPENSATED"),
    ]


def test_compensate_is_refused_for_an_escalated_undo() -> None:
    f = SagaFixture(OrderSaga)
    _refund_escalated(f)
    with pytest.raises(AssertionError, match=r"already compensating.*retry.*skip"):
        f.when_resolved("compensate")
    assert _state(f).machine_state == S.WAITING


def test_an_escalated_undo_reported_done_after_all_resumes_compensation() -> None:
    f = SagaFixture(OrderSaga)
    _refund_escalated(f)
    r = f.when(PaymentRefunded(order_id=OID)).expect_commands(_cmd(ReleaseStock))
    assert r.waiting is None
    assert _state(f).progress.late == ["pay:undone-while-escalated"]
    f.when(StockReleased(order_id=OID)).expect_ended("COMPENSATED")
    with pytest.raises(AssertionError, match="ignored-ended"):
        f.when_resolved("skip")


def test_whole_saga_deadline_records_timed_out_then_compensates() -> None:
    f = SagaFixture(OrderSaga, settings={"order.review-timeout": timedelta(days=5)})
    _paid(f)
    r = f.when_time_elapses(timedelta(days=2))
    assert r.fired == [SAGA_DEADLINE]
    r.expect_commands(_cmd(RefundPayment))
    assert _trail(f)[-2:] == [("WAITING", "TIMED_OUT"), ("TIMED_OUT", "COMPENSATING")]
    f.when(PaymentRefunded(order_id=OID))
    f.when(StockReleased(order_id=OID)).expect_ended("TIMED_OUT")
    assert _state(f).machine_state == S.COMPENSATED


def test_budget_too_small_step_is_not_started_and_saga_compensates() -> None:
    f = SagaFixture(OrderSaga, settings={"order.sla": timedelta(seconds=40)})
    f.when(_placed())
    f.when_time_elapses(timedelta(seconds=5))
    # 35 s left, but pay needs at least a minute: never sent, the reservation is released.
    f.when(StockReserved(order_id=OID)).expect_commands(_cmd(ReleaseStock))
    assert _state(f).machine_state == S.COMPENSATING
    assert "pay not started" in (_state(f).progress.reason or "")
    f.when(StockReleased(order_id=OID)).expect_ended("COMPENSATED")
    assert _state(f).machine_state == S.COMPENSATED


def test_first_step_without_budget_fails_without_compensation() -> None:
    f = SagaFixture(OrderSaga, settings={"order.sla": timedelta(seconds=5)})
    f.when(_placed()).expect_no_commands().expect_ended("FAILED")
    assert _trail(f) == [("NEW", "FAILED")]


def _timed_out_payment(f: SagaFixture) -> None:
    f.when(_placed())
    f.when(StockReserved(order_id=OID))
    f.when_time_elapses(timedelta(minutes=15)).expect_commands(_cmd(ReleaseStock))
    assert _state(f).progress.in_doubt == ["pay"]


def test_late_payment_capture_during_compensation_is_refunded() -> None:
    f = SagaFixture(OrderSaga)
    _timed_out_payment(f)
    # The capture landed after all while the stock release is in flight: refund it next.
    f.when(PaymentCaptured(order_id=OID)).expect_no_commands()
    f.when(StockReleased(order_id=OID)).expect_commands(_cmd(RefundPayment))
    f.when(PaymentRefunded(order_id=OID)).expect_ended("COMPENSATED")
    assert _state(f).machine_state == S.COMPENSATED
    assert _state(f).progress.late == ["pay:undo"]
    assert _state(f).progress.undone == ["reserve", "pay"]


def test_late_capture_after_other_undos_waits_in_compensating_then_refunds() -> None:
    f = SagaFixture(OrderSaga)
    _timed_out_payment(f)
    f.when(StockReleased(order_id=OID)).expect_no_commands().expect_active()
    assert _state(f).machine_state == S.COMPENSATING
    f.when_time_elapses(timedelta(minutes=30))
    f.when(PaymentCaptured(order_id=OID)).expect_commands(_cmd(RefundPayment))
    f.when(PaymentRefunded(order_id=OID)).expect_ended("COMPENSATED")
    assert _state(f).machine_state == S.COMPENSATED


def test_late_refusal_of_a_timed_out_step_settles_it_without_waiting() -> None:
    f = SagaFixture(OrderSaga)
    _timed_out_payment(f)
    f.when(StockReleased(order_id=OID)).expect_active()
    # The payment service answers the capture it never ran (it came past its budget).
    f.when(PaymentDeclined(order_id=OID, reason="deadline passed")).expect_ended("COMPENSATED")
    assert _state(f).machine_state == S.COMPENSATED
    assert _state(f).progress.in_doubt == []
    assert _state(f).progress.late == ["pay:rejected-resolved"]


def test_late_refusal_during_other_undos_settles_the_step_once_they_finish() -> None:
    f = SagaFixture(OrderSaga)
    _timed_out_payment(f)
    f.when(PaymentDeclined(order_id=OID, reason="expired")).expect_no_commands().expect_active()
    assert _state(f).progress.in_doubt == []
    f.when(StockReleased(order_id=OID)).expect_ended("COMPENSATED")
    assert _state(f).machine_state == S.COMPENSATED


def test_no_late_capture_within_the_window_ends_compensated() -> None:
    f = SagaFixture(OrderSaga)
    _timed_out_payment(f)
    f.when(StockReleased(order_id=OID))
    f.when_time_elapses(timedelta(hours=1)).expect_no_commands().expect_ended("COMPENSATED")
    assert _state(f).machine_state == S.COMPENSATED
    # Afterwards a capture is ignored by the engine: the saga has ended.
    assert f.when(PaymentCaptured(order_id=OID)).ignored


def test_late_success_of_an_ignore_step_is_a_recorded_no_op() -> None:
    f = SagaFixture(OrderSaga)
    _paid(f)
    f.when(FraudReviewRejected(order_id=OID, reason="suspicious"))
    # The reservation's duplicate success, and a review approval after the rejection.
    f.when(StockReserved(order_id=OID)).expect_no_commands()
    f.when(FraudReviewApproved(order_id=OID)).expect_no_commands()
    assert _state(f).progress.late == ["fraud-review:ignored"]
    assert _state(f).machine_state == S.COMPENSATING


def test_fraud_review_timeout_escalates_and_keeps_waiting() -> None:
    f = SagaFixture(OrderSaga)
    _paid(f)
    r = f.when_time_elapses(timedelta(days=1))
    r.expect_commands(
        EscalateToPerson(
            order_id=OID,
            reason="approval-timeout",
            step="fraud-review",
            machine_state="WAITING",
            detail="no decision on fraud-review",
        )
    )
    r.expect_no_deadline(STEP_TIMER).expect_active()
    assert _state(f).machine_state == S.WAITING
    # The person decides later; the saga carries on.
    f.when(FraudReviewApproved(order_id=OID)).expect_commands(_cmd(ShipOrder))


def test_review_request_carries_the_saga_deadline_not_the_escalation_timer() -> None:
    f = SagaFixture(OrderSaga)
    f.when(_placed())
    f.when(StockReserved(order_id=OID))
    r = f.when(PaymentCaptured(order_id=OID))
    saga_deadline = _state(f).progress.deadline_at
    assert saga_deadline is not None
    assert r.command_intents[0].deadline_unix_ms == int(saga_deadline.timestamp() * 1000)


@pytest.mark.parametrize("key", ["order.payment-timeout", "order.review-timeout"])
def test_timers_come_from_settings(key: str) -> None:
    f = SagaFixture(OrderSaga, settings={key: timedelta(seconds=3)})
    f.when(_placed())
    f.when(StockReserved(order_id=OID))
    if key == "order.review-timeout":
        f.when(PaymentCaptured(order_id=OID))
    assert f.pending_deadlines[STEP_TIMER] == f.now + timedelta(seconds=3)


def test_the_saga_names_where_it_is_inside_the_canonical_states() -> None:
    f = SagaFixture(OrderSaga)
    seen: list[tuple[str, str | None]] = []
    steps: list[Callable[[], object]] = [
        lambda: f.when(_placed()),
        lambda: f.when(StockReserved(order_id=OID)),
        lambda: f.when(PaymentCaptured(order_id=OID)),
        lambda: f.when(FraudReviewApproved(order_id=OID)),
        lambda: f.when_time_elapses(timedelta(hours=6)),
    ]
    for step in steps:
        step()
        seen.append((_state(f).machine_state.value, _state(f).progress.state))
    assert seen == [
        ("RUNNING", "RESERVING"),
        ("RUNNING", "CHARGING"),
        ("WAITING", "AWAITING_FRAUD_REVIEW"),
        ("RUNNING", "SHIPPING"),
        ("WAITING", "SHIPPING_ESCALATED"),
    ]
    f.when_resolved("skip").expect_ended("COMPLETED")
    assert _state(f).progress.state is None
    text = mermaid(OrderSaga.machine_spec())
    assert (
        "    state RUNNING {\n        RESERVING\n        CHARGING\n        SHIPPING\n    }\n"
        in text
    )
    assert (
        "    state WAITING {\n        AWAITING_FRAUD_REVIEW\n        SHIPPING_ESCALATED\n" in text
    )


def test_undo_escalation_fields_are_stored_only_once_used() -> None:
    # Replicas on the code before them (Progress forbids unknown fields) keep reading the rest.
    f = SagaFixture(OrderSaga)
    _paid(f)
    f.when(FraudReviewRejected(order_id=OID, reason="stolen card"))
    stored = state_to_json(_state(f))["progress"]
    assert not {"undone_by_hand", "undo_escalated", "undo_failure"} & set(stored)
    f = SagaFixture(OrderSaga)
    _refund_escalated(f)
    stored = state_to_json(_state(f))["progress"]
    assert (stored["undo_escalated"], stored["undo_failure"]) == (
        "pay",
        "undo of pay failed: provider down",
    )
    assert OrderSaga.model_validate(state_to_json(_state(f))).progress.undo_escalated == "pay"


def test_the_diagram_draws_compensation_in_the_order_it_runs() -> None:
    text = mermaid(OrderSaga.machine_spec())
    # Undos run last step first: the refund, then the stock release, chained in that order.
    assert (
        "    state COMPENSATING {\n"
        "        [*] --> CHARGING_UNDO\n"
        "        CHARGING_UNDO --> RESERVING_UNDO\n"
        "        RESERVING_UNDO --> [*]\n"
        "    }\n"
    ) in text
    assert "note right of COMPENSATING: undo pay, then reserve (last step first)" in text
    assert "        CHARGING_UNDO_ESCALATED\n        RESERVING_UNDO_ESCALATED\n" in text
    # The saga names the undo in flight the same way while it compensates.
    f = SagaFixture(OrderSaga)
    _paid(f)
    f.when(FraudReviewRejected(order_id=OID, reason="stolen card"))
    assert _state(f).progress.state == "CHARGING_UNDO"
    f.when(PaymentRefunded(order_id=OID))
    assert _state(f).progress.state == "RESERVING_UNDO"


def test_step_states_must_not_clash() -> None:
    def send(_: object) -> Message:
        return _cmd(ShipOrder)

    with pytest.raises(SagaDefinitionError) as info:
        Orchestration(
            steps=(Step("a", action=send, state="RUNNING"), Step("b", action=send, state="X Y")),
            escalation=lambda o, e: _cmd(ShipOrder),
        )
    text = str(info.value)
    assert "clashing: ['RUNNING']" in text
    assert "step state 'X Y'" in text
