"""An order as an orchestrated state machine: reserve stock, pay, fraud review, ship.

- reserve: retried (the inventory service dedupes by order and step); undone by a release.
- pay: 15 minutes to capture. A timeout compensates: the stock is released. A capture that
  lands after the timeout is refunded, because the money really moved.
- fraud-review: an analyst decides; the saga is WAITING. After one day without a decision a
  person is escalated to, and the saga keeps waiting until its own deadline.
- ship: retried with jittered backoff; after five failures a person is asked, and decides to
  retry, skip or compensate (``saga-processor saga resolve``). Nothing to undo once the carrier
  has the parcel.

The whole saga has a two-day budget; when it runs out the saga is TIMED_OUT and compensates.
Timers and the shipping retry schedule come from settings (``order.*``) so tests and staging can
shorten them. Each step names its replies, the saga its association property (``order_id``),
and the generated start handler fills the order's fields from ``OrderPlaced``.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from processor import (
    Escalation,
    Message,
    OrchestratedSaga,
    Orchestration,
    Replies,
    RetryPolicy,
    SettingKeys,
    Step,
    saga,
)
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

__all__ = [
    "DEFAULT_PAYMENT_TIMEOUT",
    "DEFAULT_REVIEW_TIMEOUT",
    "DEFAULT_SLA",
    "ORDER_ORCHESTRATION",
    "OrderSaga",
]

DEFAULT_PAYMENT_TIMEOUT = timedelta(minutes=15)
DEFAULT_REVIEW_TIMEOUT = timedelta(days=1)
DEFAULT_SLA = timedelta(days=2)
SHIP_RETRY = RetryPolicy(
    max_attempts=5, base_delay=timedelta(minutes=1), max_delay=timedelta(minutes=30)
)


def _facts(order: OrderSaga) -> dict[str, Any]:
    return {
        "order_id": order.order_id,
        "customer_id": order.customer_id,
        "sku": order.sku,
        "quantity": order.quantity,
        "amount": order.amount,
    }


def _escalate(order: OrderSaga, escalation: Escalation) -> Message:
    return EscalateToPerson(order_id=order.order_id, **escalation.model_dump())


ORDER_ORCHESTRATION = Orchestration["OrderSaga"](
    start=OrderPlaced,
    steps=(
        Step(
            "reserve",
            action=lambda o: ReserveStock(**_facts(o)),
            compensation=lambda o: ReleaseStock(**_facts(o)),
            timeout=timedelta(seconds=30),
            idempotent=True,
            retry=RetryPolicy(
                max_attempts=3, base_delay=timedelta(seconds=2), max_delay=timedelta(seconds=20)
            ),
            min_budget=timedelta(seconds=10),
            state="RESERVING",
            replies=Replies(
                succeeded=StockReserved,
                rejected=StockUnavailable,
                failed=StockReservationFailed,
                undone=StockReleased,
            ),
        ),
        Step(
            "pay",
            action=lambda o: CapturePayment(**_facts(o)),
            compensation=lambda o: RefundPayment(**_facts(o)),
            timeout=DEFAULT_PAYMENT_TIMEOUT,
            min_budget=timedelta(minutes=1),
            late_success="undo",
            late_window=timedelta(hours=1),
            state="CHARGING",
            replies=Replies(
                succeeded=PaymentCaptured,
                rejected=PaymentDeclined,
                undone=PaymentRefunded,
                undo_failed=RefundFailed,
            ),
        ),
        Step(
            "fraud-review",
            action=lambda o: RequestFraudReview(**_facts(o)),
            timeout=DEFAULT_REVIEW_TIMEOUT,
            waits_for_person=True,
            on_timeout="escalate",
            state="AWAITING_FRAUD_REVIEW",
            replies=Replies(succeeded=FraudReviewApproved, rejected=FraudReviewRejected),
        ),
        Step(
            "ship",
            action=lambda o: ShipOrder(**_facts(o)),
            timeout=timedelta(hours=1),
            idempotent=True,
            retry=SHIP_RETRY,
            min_budget=timedelta(minutes=5),
            # A carrier outage is no reason to refund: a person decides (saga resolve).
            on_exhausted="escalate",
            state="SHIPPING",
            replies=Replies(succeeded=OrderShipped, failed=ShipmentFailed),
        ),
    ),
    escalation=_escalate,
    sla=DEFAULT_SLA,
    on_saga_timeout="compensate",
    settings=SettingKeys(
        sla="order.sla",
        timeouts={"pay": "order.payment-timeout", "fraud-review": "order.review-timeout"},
        retries={"ship": "order.ship-retry"},
    ),
)


@saga(type="order-saga", association_property="order_id")
class OrderSaga(OrchestratedSaga):
    """Takes an order from placement to shipment, or undoes what was done."""

    orchestration = ORDER_ORCHESTRATION

    order_id: str = ""
    customer_id: str = ""
    sku: str = ""
    quantity: int = 0
    amount: Decimal = Decimal(0)
