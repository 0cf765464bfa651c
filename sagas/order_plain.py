"""The order saga of ``sagas/order.py`` written with plain handlers, for comparison.

Same flow and messages: reserve stock, capture the payment (15 minutes; a capture that lands
after the timeout is refunded, never resumed), a fraud review (a day, then a person is asked),
ship (retried, then a person decides: retry or compensate). Every timer, every retry count and
every undo is bookkeeping the handlers below do themselves; the orchestrated version declares
them. It is not part of the example sagas the processor runs (its type differs, and both would
react to the same events); ``docs/sagas.md`` sets the two side by side.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from pydantic import Field

from processor import (
    CancelRequest,
    DecisionRequest,
    SagaCommands,
    SagaDeadlines,
    SagaLifecycle,
    SagaOutcome,
    SagaState,
    saga,
    saga_cancel_handler,
    saga_deadline_handler,
    saga_decision_handler,
    saga_event_handler,
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

__all__ = ["PlainOrderSaga"]

PAYMENT_TIMEOUT = timedelta(minutes=15)
REVIEW_TIMEOUT = timedelta(days=1)
SHIP_ATTEMPTS = 5
SHIP_BACKOFF = timedelta(minutes=1)
# How long a capture that lands after the payment timeout is still listened for (and refunded).
LATE_WINDOW = timedelta(hours=1)


@saga(type="order-saga-plain")
class PlainOrderSaga(SagaState):
    """Takes an order from placement to shipment, or undoes what was done."""

    order_id: str = ""
    customer_id: str = ""
    sku: str = ""
    quantity: int = 0
    amount: Decimal = Decimal(0)
    # Shown by `show` and the console beside the canonical state.
    state_label: str = "RESERVING"
    reserved: bool = False
    captured: bool = False
    ship_attempts: int = 0
    # Undo commands sent and not yet confirmed: the saga ends once none is left.
    undoing: list[str] = Field(default_factory=list)
    # How it ends once its undos are confirmed: at least the reservation's release runs.
    outcome: SagaOutcome = SagaOutcome.COMPENSATED

    @saga_event_handler(OrderPlaced, association_property="order_id", start=True)
    def on_placed(self, event: OrderPlaced, commands: SagaCommands) -> None:
        self.order_id, self.customer_id, self.sku = event.order_id, event.customer_id, event.sku
        self.quantity, self.amount = event.quantity, event.amount
        commands.send(ReserveStock(**self._facts()))

    @saga_event_handler(StockReserved, association_property="order_id")
    def on_reserved(
        self, event: StockReserved, commands: SagaCommands, deadlines: SagaDeadlines
    ) -> None:
        if self.state_label != "RESERVING":
            return  # cancelled meanwhile: its release is on its way
        self.reserved, self.state_label = True, "CHARGING"
        commands.send(CapturePayment(**self._facts()))
        deadlines.schedule("payment-timeout", PAYMENT_TIMEOUT)

    @saga_event_handler(StockUnavailable, association_property="order_id")
    def on_unavailable(self, event: StockUnavailable, lifecycle: SagaLifecycle) -> None:
        lifecycle.end(SagaOutcome.FAILED)  # nothing was done, nothing to undo

    @saga_event_handler(PaymentCaptured, association_property="order_id")
    def on_captured(
        self, event: PaymentCaptured, commands: SagaCommands, deadlines: SagaDeadlines
    ) -> None:
        self.captured = True
        if self.state_label != "CHARGING":
            # Landed after the timeout: the order is being undone, so the money goes back.
            if "late-window" in self.undoing:
                self.undoing.remove("late-window")
                deadlines.cancel("late-window")
            self._undo(commands, RefundPayment(**self._facts()))
            return
        self.state_label = "AWAITING_FRAUD_REVIEW"
        deadlines.cancel("payment-timeout")
        commands.send(RequestFraudReview(**self._facts()))
        deadlines.schedule("review-timeout", REVIEW_TIMEOUT)

    @saga_event_handler(PaymentDeclined, association_property="order_id")
    def on_declined(
        self, event: PaymentDeclined, commands: SagaCommands, deadlines: SagaDeadlines
    ) -> None:
        deadlines.cancel("payment-timeout")
        self._compensate(commands, deadlines)

    @saga_deadline_handler("payment-timeout")
    def on_payment_timeout(self, commands: SagaCommands, deadlines: SagaDeadlines) -> None:
        self._compensate(commands, deadlines)
        self.undoing.append("late-window")  # a capture that lands meanwhile is refunded
        deadlines.schedule("late-window", LATE_WINDOW)

    @saga_event_handler(FraudReviewApproved, association_property="order_id")
    def on_approved(
        self, event: FraudReviewApproved, commands: SagaCommands, deadlines: SagaDeadlines
    ) -> None:
        deadlines.cancel("review-timeout")
        self._ship(commands, deadlines)

    @saga_event_handler(FraudReviewRejected, association_property="order_id")
    def on_rejected(
        self, event: FraudReviewRejected, commands: SagaCommands, deadlines: SagaDeadlines
    ) -> None:
        deadlines.cancel("review-timeout")
        self._compensate(commands, deadlines)

    @saga_deadline_handler("review-timeout")
    def on_review_timeout(self, commands: SagaCommands, lifecycle: SagaLifecycle) -> None:
        commands.send(
            self._person("approval-timeout", "fraud-review", "no decision on fraud-review")
        )
        lifecycle.escalate("no fraud review decision within a day")

    @saga_event_handler(OrderShipped, association_property="order_id")
    def on_shipped(
        self, event: OrderShipped, deadlines: SagaDeadlines, lifecycle: SagaLifecycle
    ) -> None:
        deadlines.cancel("ship-retry")
        lifecycle.end(SagaOutcome.COMPLETED)

    @saga_event_handler(ShipmentFailed, association_property="order_id")
    def on_ship_failed(
        self,
        event: ShipmentFailed,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
    ) -> None:
        if self.ship_attempts < SHIP_ATTEMPTS:
            deadlines.schedule("ship-retry", SHIP_BACKOFF * 2 ** (self.ship_attempts - 1))
            return
        commands.send(self._person("retries-exhausted", "ship", event.reason))
        lifecycle.escalate(f"shipping failed {self.ship_attempts} times")

    @saga_deadline_handler("ship-retry")
    def on_ship_retry(self, commands: SagaCommands, deadlines: SagaDeadlines) -> None:
        self._ship(commands, deadlines)

    @saga_decision_handler()
    def on_decision(
        self, request: DecisionRequest, commands: SagaCommands, deadlines: SagaDeadlines
    ) -> None:
        if request.decision == "retry" and self.state_label == "SHIPPING":
            self.ship_attempts = 0
            self._ship(commands, deadlines)
        else:
            self._compensate(commands, deadlines)

    @saga_cancel_handler()
    def on_cancel(
        self, request: CancelRequest, commands: SagaCommands, deadlines: SagaDeadlines
    ) -> None:
        self.outcome = SagaOutcome.CANCELLED
        self._compensate(commands, deadlines)

    @saga_event_handler(StockReleased, association_property="order_id")
    def on_released(self, event: StockReleased, lifecycle: SagaLifecycle) -> None:
        self._undone("release", lifecycle)

    @saga_event_handler(PaymentRefunded, association_property="order_id")
    def on_refunded(self, event: PaymentRefunded, lifecycle: SagaLifecycle) -> None:
        self._undone("refund", lifecycle)

    @saga_deadline_handler("late-window")
    def on_late_window(self, lifecycle: SagaLifecycle) -> None:
        self._undone("late-window", lifecycle)

    # -- bookkeeping the orchestrated version does for you --------------------------------------

    def _ship(self, commands: SagaCommands, deadlines: SagaDeadlines) -> None:
        self.state_label, self.ship_attempts = "SHIPPING", self.ship_attempts + 1
        commands.send(ShipOrder(**self._facts()))

    def _compensate(self, commands: SagaCommands, deadlines: SagaDeadlines) -> None:
        self.state_label = "COMPENSATING"
        for name in ("payment-timeout", "review-timeout", "ship-retry"):
            deadlines.cancel(name)
        if self.captured:
            self._undo(commands, RefundPayment(**self._facts()))
        # Released even while the reservation is in flight: the inventory handles both in order.
        self._undo(commands, ReleaseStock(**self._facts()))

    def _undo(self, commands: SagaCommands, command: RefundPayment | ReleaseStock) -> None:
        if command.step not in self.undoing:
            self.undoing.append(command.step)
            commands.send(command)

    def _undone(self, step: str, lifecycle: SagaLifecycle) -> None:
        if step in self.undoing:
            self.undoing.remove(step)
        if not self.undoing:
            lifecycle.end(self.outcome)

    def _person(self, reason: str, step: str, detail: str) -> EscalateToPerson:
        return EscalateToPerson(
            order_id=self.order_id, reason=reason, step=step, machine_state="WAITING", detail=detail
        )

    def _facts(self) -> dict[str, Any]:
        return {
            "order_id": self.order_id,
            "customer_id": self.customer_id,
            "sku": self.sku,
            "quantity": self.quantity,
            "amount": self.amount,
        }
