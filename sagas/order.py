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
shorten them.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Annotated, Any, ClassVar

from processor import SagaCommands, SagaDeadlines, SagaLifecycle, Setting, saga, saga_event_handler
from processor.machine import (
    Escalation,
    OrchestratedSaga,
    Orchestration,
    ReplyHandler,
    RetryPolicy,
    Step,
    on_reply,
)
from processor.messages import Message
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

PaymentTimeout = Annotated[
    timedelta, Setting("order.payment-timeout", default=DEFAULT_PAYMENT_TIMEOUT)
]
ReviewTimeout = Annotated[
    timedelta, Setting("order.review-timeout", default=DEFAULT_REVIEW_TIMEOUT)
]
Sla = Annotated[timedelta, Setting("order.sla", default=DEFAULT_SLA)]
SHIP_RETRY = RetryPolicy(
    max_attempts=5, base_delay=timedelta(minutes=1), max_delay=timedelta(minutes=30)
)
ShipRetry = Annotated[RetryPolicy, Setting("order.ship-retry", default=SHIP_RETRY)]


def _facts(order: Any) -> dict[str, Any]:
    return {
        "order_id": order.order_id,
        "customer_id": order.customer_id,
        "sku": order.sku,
        "quantity": order.quantity,
        "amount": order.amount,
    }


def _escalate(order: Any, escalation: Escalation) -> Message:
    return EscalateToPerson(order_id=order.order_id, **escalation.model_dump())


ORDER_ORCHESTRATION = Orchestration(
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
        ),
        Step(
            "fraud-review",
            action=lambda o: RequestFraudReview(**_facts(o)),
            timeout=DEFAULT_REVIEW_TIMEOUT,
            waits_for_person=True,
            on_timeout="escalate",
            state="AWAITING_FRAUD_REVIEW",
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
        ),
    ),
    escalation=_escalate,
    sla=DEFAULT_SLA,
    on_saga_timeout="compensate",
)


@saga(type="order-saga")
class OrderSaga(OrchestratedSaga):
    """Takes an order from placement to shipment, or undoes what was done."""

    orchestration = ORDER_ORCHESTRATION

    order_id: str = ""
    customer_id: str = ""
    sku: str = ""
    quantity: int = 0
    amount: Decimal = Decimal(0)

    @saga_event_handler(OrderPlaced, association_property="order_id", start=True)
    def on_placed(
        self,
        event: OrderPlaced,
        *,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        payment_timeout: PaymentTimeout,
        review_timeout: ReviewTimeout,
        sla: Sla,
        ship_retry: ShipRetry,
    ) -> None:
        """Copy the order and reserve its stock."""
        self.order_id = event.order_id
        self.customer_id = event.customer_id
        self.sku = event.sku
        self.quantity = event.quantity
        self.amount = event.amount
        self.begin(
            event.order_id,
            commands,
            deadlines,
            lifecycle,
            sla=sla,
            timeouts={"pay": payment_timeout, "fraud-review": review_timeout},
            retries={"ship": ship_retry},
        )

    on_stock_reserved: ClassVar[ReplyHandler] = on_reply(
        StockReserved, step="reserve", association_property="order_id"
    )
    on_stock_unavailable: ClassVar[ReplyHandler] = on_reply(
        StockUnavailable, step="reserve", kind="rejected", association_property="order_id"
    )
    on_reservation_failed: ClassVar[ReplyHandler] = on_reply(
        StockReservationFailed, step="reserve", kind="failed", association_property="order_id"
    )
    on_stock_released: ClassVar[ReplyHandler] = on_reply(
        StockReleased, step="reserve", kind="undone", association_property="order_id"
    )
    on_payment_captured: ClassVar[ReplyHandler] = on_reply(
        PaymentCaptured, step="pay", association_property="order_id"
    )
    on_payment_declined: ClassVar[ReplyHandler] = on_reply(
        PaymentDeclined, step="pay", kind="rejected", association_property="order_id"
    )
    on_payment_refunded: ClassVar[ReplyHandler] = on_reply(
        PaymentRefunded, step="pay", kind="undone", association_property="order_id"
    )
    on_refund_failed: ClassVar[ReplyHandler] = on_reply(
        RefundFailed, step="pay", kind="undo-failed", association_property="order_id"
    )
    on_review_approved: ClassVar[ReplyHandler] = on_reply(
        FraudReviewApproved, step="fraud-review", association_property="order_id"
    )
    on_review_rejected: ClassVar[ReplyHandler] = on_reply(
        FraudReviewRejected, step="fraud-review", kind="rejected", association_property="order_id"
    )
    on_shipped: ClassVar[ReplyHandler] = on_reply(
        OrderShipped, step="ship", association_property="order_id"
    )
    on_shipment_failed: ClassVar[ReplyHandler] = on_reply(
        ShipmentFailed, step="ship", kind="failed", association_property="order_id"
    )
