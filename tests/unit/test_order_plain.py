"""The order saga in plain handlers (sagas/order_plain.py) through the same paths as the
orchestrated one, with the fixture and virtual time: docs/sagas.md sets the two side by side."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal

from processor._authoring.messages import Message
from processor._ports.views import step_state
from processor.testing import SagaFixture
from sagas.order_plain import PlainOrderSaga
from schemas.orders import (
    CapturePayment,
    EscalateToPerson,
    FraudReviewApproved,
    FraudReviewRejected,
    OrderPlaced,
    OrderShipped,
    PaymentCaptured,
    PaymentRefunded,
    RefundPayment,
    ReleaseStock,
    RequestFraudReview,
    ReserveStock,
    ShipmentFailed,
    ShipOrder,
    StockReleased,
    StockReserved,
    StockUnavailable,
)

OID = "o-1"
FACTS = {"order_id": OID, "customer_id": "c-1", "sku": "sku-1", "quantity": 2}
AMOUNT = Decimal("19.99")


def _cmd(cls: Callable[..., Message]) -> Message:
    return cls(**FACTS, amount=AMOUNT)


def _label(f: SagaFixture) -> str:
    state = f.state
    assert isinstance(state, PlainOrderSaga)
    return state.state_label


def _paid() -> SagaFixture:
    f = SagaFixture(PlainOrderSaga)
    f.when(OrderPlaced(**FACTS, amount=AMOUNT)).expect_commands(_cmd(ReserveStock))
    f.when(StockReserved(order_id=OID)).expect_commands(_cmd(CapturePayment))
    f.when(PaymentCaptured(order_id=OID)).expect_commands(_cmd(RequestFraudReview))
    assert _label(f) == "AWAITING_FRAUD_REVIEW"
    return f


def test_happy_path_completes() -> None:
    f = _paid()
    f.when(FraudReviewApproved(order_id=OID)).expect_commands(_cmd(ShipOrder))
    assert _label(f) == "SHIPPING"
    f.when(OrderShipped(order_id=OID)).expect_ended("COMPLETED").expect_no_deadlines()


def test_sold_out_ends_failed_with_nothing_to_undo() -> None:
    f = SagaFixture(PlainOrderSaga)
    f.when(OrderPlaced(**FACTS, amount=AMOUNT))
    f.when(StockUnavailable(order_id=OID, reason="sold out")).expect_no_commands().expect_ended(
        "FAILED"
    )


def test_payment_timeout_releases_and_a_late_capture_is_refunded_never_resumed() -> None:
    f = SagaFixture(PlainOrderSaga)
    f.when(OrderPlaced(**FACTS, amount=AMOUNT))
    f.when(StockReserved(order_id=OID))
    f.when_time_elapses(timedelta(minutes=15)).expect_commands(_cmd(ReleaseStock))
    f.when(StockReleased(order_id=OID)).expect_active()  # still listening for a late capture
    f.when(PaymentCaptured(order_id=OID)).expect_commands(_cmd(RefundPayment))
    assert _label(f) == "COMPENSATING"
    f.when(PaymentRefunded(order_id=OID)).expect_ended("COMPENSATED").expect_no_deadlines()


def test_payment_timeout_without_a_late_capture_ends_when_the_window_closes() -> None:
    f = SagaFixture(PlainOrderSaga)
    f.when(OrderPlaced(**FACTS, amount=AMOUNT))
    f.when(StockReserved(order_id=OID))
    f.when_time_elapses(timedelta(minutes=15)).expect_commands(_cmd(ReleaseStock))
    f.when(StockReleased(order_id=OID)).expect_active()
    f.when_time_elapses(timedelta(hours=1)).expect_no_commands().expect_ended("COMPENSATED")


def test_review_timeout_escalates_to_a_person_whose_rejection_undoes_the_order() -> None:
    f = _paid()
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
    assert r.waiting == "no fraud review decision within a day"
    r = f.when(FraudReviewRejected(order_id=OID, reason="a person said no"))
    r.expect_commands(_cmd(RefundPayment), _cmd(ReleaseStock))
    f.when(PaymentRefunded(order_id=OID)).expect_active()
    f.when(StockReleased(order_id=OID)).expect_ended("COMPENSATED")


def test_shipping_retries_then_a_person_decides_to_compensate() -> None:
    f = _paid()
    f.when(FraudReviewApproved(order_id=OID))
    for attempt in range(1, 5):
        f.when(ShipmentFailed(order_id=OID, reason="carrier down")).expect_no_commands()
        f.when_time_elapses(timedelta(minutes=2**attempt)).expect_commands(_cmd(ShipOrder))
    r = f.when(ShipmentFailed(order_id=OID, reason="carrier down"))
    assert r.waiting == "shipping failed 5 times"
    f.when_resolved("compensate", "carrier gone for good").expect_commands(
        _cmd(RefundPayment), _cmd(ReleaseStock)
    )
    f.when(PaymentRefunded(order_id=OID))
    f.when(StockReleased(order_id=OID)).expect_ended("COMPENSATED")


def test_a_person_may_retry_shipping() -> None:
    f = _paid()
    f.when(FraudReviewApproved(order_id=OID))
    for attempt in range(1, 5):
        f.when(ShipmentFailed(order_id=OID, reason="carrier down"))
        f.when_time_elapses(timedelta(minutes=2**attempt))
    f.when(ShipmentFailed(order_id=OID, reason="carrier down"))
    f.when_resolved("retry", "carrier is back").expect_commands(_cmd(ShipOrder))
    f.when(OrderShipped(order_id=OID)).expect_ended("COMPLETED")


def test_cancel_releases_and_refunds() -> None:
    f = _paid()
    f.when_cancelled("customer changed their mind").expect_commands(
        _cmd(RefundPayment), _cmd(ReleaseStock)
    )
    f.when(StockReleased(order_id=OID)).expect_active()
    f.when(PaymentRefunded(order_id=OID)).expect_ended("CANCELLED")


def test_its_state_label_is_what_show_and_the_console_print_beside_the_canonical_state() -> None:
    f = _paid()
    state = f.state
    assert state is not None
    assert step_state(state.model_dump(mode="json")) == "AWAITING_FRAUD_REVIEW"
    assert step_state({"transfer_id": "t-1"}) is None
