"""The order saga's participants on the participant kit: inventory, payment, fraud review, shipping.

Each is a handful of SQL statements in the service's own schema; the kit runs each command once
in effect (inbox by message id) and answers with the events the saga waits for. Business steps
are idempotent by order too (a saga's retry is a new command with a new message id): a second
reservation of the same order answers like the first.

Money: a capture moves the order's amount from the customer's wallet to the merchant, a refund
moves it back, so the sum of all wallets and the merchant never changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from processor.participant import DROP, Replies, Sql, command_handler, participant
from schemas.orders import (
    CapturePayment,
    FraudReviewApproved,
    FraudReviewRejected,
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
    "DDL",
    "EXPIRED",
    "MERCHANT",
    "FraudReview",
    "Inventory",
    "Payments",
    "Shipping",
    "order_participants",
    "settle_late",
    "stock_up",
]

MERCHANT = "merchant"
EXPIRED = "deadline passed before the command ran"

DDL = """
CREATE TABLE IF NOT EXISTS stock (
    sku       text PRIMARY KEY,
    available int  NOT NULL CHECK (available >= 0)
);
CREATE TABLE IF NOT EXISTS reservation (
    order_id text PRIMARY KEY,
    sku      text NOT NULL,
    quantity int  NOT NULL,
    released boolean NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS wallet (
    owner   text          PRIMARY KEY,
    balance numeric(18,2) NOT NULL CHECK (balance >= 0)
);
CREATE TABLE IF NOT EXISTS payment (
    order_id text          PRIMARY KEY,
    customer text          NOT NULL,
    amount   numeric(18,2) NOT NULL,
    refunded boolean       NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS shipment (order_id text PRIMARY KEY);
CREATE TABLE IF NOT EXISTS review (order_id text PRIMARY KEY, approved boolean NOT NULL);
-- Captures the bank has not settled yet (the slow customers' orders).
CREATE TABLE IF NOT EXISTS pending_capture (
    order_id text          PRIMARY KEY,
    customer text          NOT NULL,
    amount   numeric(18,2) NOT NULL
);
"""


def stock_up(sql: Sql, stock: Mapping[str, int], wallets: Mapping[str, Decimal]) -> None:
    """Sets stock levels and wallet balances (the merchant's included, at 0 when absent).

    ``sql`` finds the services' tables first (a connection whose search path is their schema).
    """
    for sku, n in stock.items():
        sql.execute(
            "INSERT INTO stock VALUES (%s, %s) ON CONFLICT (sku) DO UPDATE SET available = %s",
            (sku, n, n),
        )
    for owner, balance in {MERCHANT: Decimal(0), **wallets}.items():
        sql.execute(
            "INSERT INTO wallet VALUES (%s, %s) ON CONFLICT (owner) DO UPDATE SET balance = %s",
            (owner, balance, balance),
        )


@participant(name="inventory")
class Inventory:
    """Holds and releases stock."""

    @command_handler(expired=lambda c: StockReservationFailed(order_id=c.order_id, reason=EXPIRED))
    def reserve(self, command: ReserveStock, replies: Replies, sql: Sql) -> None:
        held = sql.execute(
            "SELECT released FROM reservation WHERE order_id = %s", (command.order_id,)
        ).fetchone()
        if held is not None and not held[0]:
            replies.send(StockReserved(order_id=command.order_id))
            return
        taken = sql.execute(
            "UPDATE stock SET available = available - %s WHERE sku = %s AND available >= %s",
            (command.quantity, command.sku, command.quantity),
        )
        if taken.rowcount == 0:
            replies.send(StockUnavailable(order_id=command.order_id, reason="not enough stock"))
            return
        sql.execute(
            "INSERT INTO reservation VALUES (%s, %s, %s, false) ON CONFLICT (order_id) "
            "DO UPDATE SET released = false",
            (command.order_id, command.sku, command.quantity),
        )
        replies.send(StockReserved(order_id=command.order_id))

    @command_handler()
    def release(self, command: ReleaseStock, replies: Replies, sql: Sql) -> None:
        row = sql.execute(
            "UPDATE reservation SET released = true WHERE order_id = %s AND NOT released "
            "RETURNING sku, quantity",
            (command.order_id,),
        ).fetchone()
        if row is not None:
            sql.execute(
                "UPDATE stock SET available = available + %s WHERE sku = %s", (row[1], row[0])
            )
        replies.send(StockReleased(order_id=command.order_id))


@participant(name="payment")
class Payments:
    """Captures and refunds: moves money between a customer's wallet and the merchant.

    The bank of the slow customers settles their captures only later (see ``settle_late``):
    their capture gets no answer, the saga's payment timeout fires first.
    """

    slow_prefix = "c-slow"

    @command_handler(expired=lambda c: PaymentDeclined(order_id=c.order_id, reason=EXPIRED))
    def capture(self, command: CapturePayment, replies: Replies, sql: Sql) -> None:
        paid = sql.execute(
            "SELECT refunded FROM payment WHERE order_id = %s", (command.order_id,)
        ).fetchone()
        if paid is not None:
            replies.send(PaymentCaptured(order_id=command.order_id))
            return
        if command.customer_id.startswith(self.slow_prefix):
            sql.execute(
                "INSERT INTO pending_capture VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                (command.order_id, command.customer_id, command.amount),
            )
            return
        if not take_payment(sql, command.order_id, command.customer_id, command.amount):
            replies.send(PaymentDeclined(order_id=command.order_id, reason="insufficient funds"))
            return
        replies.send(PaymentCaptured(order_id=command.order_id))

    @command_handler(expired=lambda c: RefundFailed(order_id=c.order_id, reason=EXPIRED))
    def refund(self, command: RefundPayment, replies: Replies, sql: Sql) -> None:
        row = sql.execute(
            "UPDATE payment SET refunded = true WHERE order_id = %s AND NOT refunded "
            "RETURNING customer, amount",
            (command.order_id,),
        ).fetchone()
        if row is not None:
            sql.execute(
                "UPDATE wallet SET balance = balance - %s WHERE owner = %s", (row[1], MERCHANT)
            )
            sql.execute(
                "UPDATE wallet SET balance = balance + %s WHERE owner = %s", (row[1], row[0])
            )
        replies.send(PaymentRefunded(order_id=command.order_id))


def take_payment(sql: Sql, order_id: str, customer: str, amount: Decimal) -> bool:
    """Moves ``amount`` from the customer's wallet to the merchant's; False if it is short."""
    taken = sql.execute(
        "UPDATE wallet SET balance = balance - %s WHERE owner = %s AND balance >= %s",
        (amount, customer, amount),
    )
    if taken.rowcount == 0:
        return False
    sql.execute("UPDATE wallet SET balance = balance + %s WHERE owner = %s", (amount, MERCHANT))
    sql.execute("INSERT INTO payment VALUES (%s, %s, %s, false)", (order_id, customer, amount))
    return True


def settle_late(sql: Sql) -> list[str]:
    """The slow bank settles the captures whose order the saga has given up on (its stock is
    released): the money moves now, after the payment timeout. Returns their order ids; the
    caller tells the saga (a late ``PaymentCaptured``), which refunds it."""
    rows = sql.execute(
        "DELETE FROM pending_capture AS p USING reservation AS r "
        "WHERE r.order_id = p.order_id AND r.released RETURNING p.order_id, p.customer, p.amount"
    ).fetchall()
    return [
        order_id
        for order_id, customer, amount in rows
        if take_payment(sql, order_id, customer, amount)
    ]


@participant(name="fraud-review")
class FraudReview:
    """Stands in for an analyst: approves an order unless its customer is flagged.

    Nobody reviews the unusual customers' orders: the saga's review timeout escalates them to
    a person.
    """

    flagged_prefix = "fraud-"
    unusual_prefix = "c-unusual"

    # A review nobody started in time is the saga's to escalate: no reply.
    @command_handler(expired=DROP)
    def review(self, command: RequestFraudReview, replies: Replies, sql: Sql) -> None:
        if command.customer_id.startswith(self.unusual_prefix):
            return
        approved = not command.customer_id.startswith(self.flagged_prefix)
        sql.execute(
            "INSERT INTO review VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (command.order_id, approved),
        )
        if approved:
            replies.send(FraudReviewApproved(order_id=command.order_id))
        else:
            replies.send(FraudReviewRejected(order_id=command.order_id, reason="flagged"))


@participant(name="shipping")
class Shipping:
    """Hands the parcel to the carrier; no carrier serves the remote customers' addresses."""

    remote_prefix = "c-remote"

    @command_handler(expired=lambda c: ShipmentFailed(order_id=c.order_id, reason=EXPIRED))
    def ship(self, command: ShipOrder, replies: Replies, sql: Sql) -> None:
        if command.customer_id.startswith(self.remote_prefix):
            replies.send(
                ShipmentFailed(order_id=command.order_id, reason="no carrier serves the address")
            )
            return
        sql.execute("INSERT INTO shipment VALUES (%s) ON CONFLICT DO NOTHING", (command.order_id,))
        replies.send(OrderShipped(order_id=command.order_id))


def order_participants() -> list[object]:
    """One instance of each order participant."""
    return [Inventory(), Payments(), FraudReview(), Shipping()]
