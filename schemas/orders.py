"""Messages of the order saga (``sagas.order``).

Services publish replies to ``order-events`` and consume commands from ``order-commands``; the
commands carry the ``deadline-unix-ms`` header, after which a service should not start the work.
Every message carries the ``order_id`` correlation id. Each command names its ``step`` so a
service can apply it at most once, keyed by ``(order_id, step)``. Requests for a person go to
``escalations``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ValidationInfo

from processor import Message, message_type
from schemas.transfers import Amount

__all__ = [
    "ESCALATIONS_TOPIC",
    "ORDER_COMMANDS_TOPIC",
    "ORDER_EVENTS_TOPIC",
    "CapturePayment",
    "EscalateToPerson",
    "FraudReviewApproved",
    "FraudReviewRejected",
    "OrderPlaced",
    "OrderShipped",
    "PaymentCaptured",
    "PaymentDeclined",
    "PaymentRefunded",
    "RefundFailed",
    "RefundPayment",
    "ReleaseStock",
    "RequestFraudReview",
    "ReserveStock",
    "ShipOrder",
    "ShipmentFailed",
    "StockReleased",
    "StockReservationFailed",
    "StockReserved",
    "StockUnavailable",
]

ORDER_EVENTS_TOPIC = "order-events"
ORDER_COMMANDS_TOPIC = "order-commands"
ESCALATIONS_TOPIC = "escalations"


def _json_integer(value: Any, info: ValidationInfo) -> Any:
    # The exported schema says "integer": a JSON string or boolean is none, whatever the lax
    # mode of the model would make of it.
    if info.mode == "json" and isinstance(value, str | bool):
        raise ValueError("a quantity is a JSON integer")
    return value


Quantity = Annotated[int, BeforeValidator(_json_integer)]
"""How many items; a JSON integer on the wire."""


class _OrderFacts(Message):
    # Self-contained: every service finds what it needs in the message itself.
    order_id: str
    customer_id: str
    sku: str
    quantity: Quantity
    amount: Amount


class _OrderReply(Message):
    order_id: str


class _OrderRefusal(_OrderReply):
    reason: str


@message_type("orders.OrderPlaced", topic=ORDER_EVENTS_TOPIC)
class OrderPlaced(_OrderFacts):
    """A customer placed an order; starts the saga."""


@message_type("orders.ReserveStock", topic=ORDER_COMMANDS_TOPIC)
class ReserveStock(_OrderFacts):
    """Hold the stock; answered by StockReserved, StockUnavailable or StockReservationFailed."""

    step: Literal["reserve"] = "reserve"


@message_type("orders.StockReserved", topic=ORDER_EVENTS_TOPIC)
class StockReserved(_OrderReply):
    """The stock is held for the order."""


@message_type("orders.StockUnavailable", topic=ORDER_EVENTS_TOPIC)
class StockUnavailable(_OrderRefusal):
    """There is not enough stock; a business refusal, not worth retrying."""


@message_type("orders.StockReservationFailed", topic=ORDER_EVENTS_TOPIC)
class StockReservationFailed(_OrderRefusal):
    """The inventory service could not answer (e.g. overloaded); worth retrying."""


@message_type("orders.ReleaseStock", topic=ORDER_COMMANDS_TOPIC)
class ReleaseStock(_OrderFacts):
    """Undo of ReserveStock; answered by StockReleased."""

    step: Literal["release"] = "release"


@message_type("orders.StockReleased", topic=ORDER_EVENTS_TOPIC)
class StockReleased(_OrderReply):
    """The held stock is back on the shelf."""


@message_type("orders.CapturePayment", topic=ORDER_COMMANDS_TOPIC)
class CapturePayment(_OrderFacts):
    """Capture the payment; answered by PaymentCaptured or PaymentDeclined."""

    step: Literal["pay"] = "pay"


@message_type("orders.PaymentCaptured", topic=ORDER_EVENTS_TOPIC)
class PaymentCaptured(_OrderReply):
    """The money was taken."""


@message_type("orders.PaymentDeclined", topic=ORDER_EVENTS_TOPIC)
class PaymentDeclined(_OrderRefusal):
    """The payment provider refused the capture."""


@message_type("orders.RefundPayment", topic=ORDER_COMMANDS_TOPIC)
class RefundPayment(_OrderFacts):
    """Undo of CapturePayment, a new forward fact; answered by PaymentRefunded or RefundFailed."""

    step: Literal["refund"] = "refund"


@message_type("orders.PaymentRefunded", topic=ORDER_EVENTS_TOPIC)
class PaymentRefunded(_OrderReply):
    """The captured money went back to the customer."""


@message_type("orders.RefundFailed", topic=ORDER_EVENTS_TOPIC)
class RefundFailed(_OrderRefusal):
    """The refund did not go through (yet)."""


@message_type("orders.RequestFraudReview", topic=ORDER_COMMANDS_TOPIC)
class RequestFraudReview(_OrderFacts):
    """Ask a fraud analyst to look at the order; answered by an approval or a rejection."""

    step: Literal["fraud-review"] = "fraud-review"


@message_type("orders.FraudReviewApproved", topic=ORDER_EVENTS_TOPIC)
class FraudReviewApproved(_OrderReply):
    """An analyst cleared the order."""


@message_type("orders.FraudReviewRejected", topic=ORDER_EVENTS_TOPIC)
class FraudReviewRejected(_OrderRefusal):
    """An analyst stopped the order."""


@message_type("orders.ShipOrder", topic=ORDER_COMMANDS_TOPIC)
class ShipOrder(_OrderFacts):
    """Hand the order to the carrier; answered by OrderShipped or ShipmentFailed."""

    step: Literal["ship"] = "ship"


@message_type("orders.OrderShipped", topic=ORDER_EVENTS_TOPIC)
class OrderShipped(_OrderReply):
    """The carrier has the parcel."""


@message_type("orders.ShipmentFailed", topic=ORDER_EVENTS_TOPIC)
class ShipmentFailed(_OrderRefusal):
    """The warehouse could not hand over the parcel (yet); worth retrying."""


@message_type("orders.EscalateToPerson", topic=ESCALATIONS_TOPIC)
class EscalateToPerson(Message):
    """A person must act on the order: an undo failed, or a review got no decision in time."""

    order_id: str
    reason: str
    step: str | None
    machine_state: str
    detail: str
