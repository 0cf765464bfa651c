"""An inventory service on the participant kit: the example of docs/participants.md."""

from processor import ParticipantApp
from processor.participant import Replies, Sql, command_handler, participant
from schemas.orders import ReserveStock, StockReservationFailed, StockReserved, StockUnavailable

TABLES = """
CREATE TABLE stock (sku text PRIMARY KEY, available int NOT NULL CHECK (available >= 0));
CREATE TABLE reservation (order_id text PRIMARY KEY, sku text NOT NULL, quantity int NOT NULL);
"""


@participant(name="inventory")
class Inventory:
    @command_handler(
        expired=lambda c: StockReservationFailed(order_id=c.order_id, reason="expired")
    )
    def reserve(self, command: ReserveStock, replies: Replies, sql: Sql) -> None:
        if sql.execute(
            "SELECT 1 FROM reservation WHERE order_id = %s", (command.order_id,)
        ).fetchone():
            replies.send(StockReserved(order_id=command.order_id))  # a retry of the saga
            return
        taken = sql.execute(
            "UPDATE stock SET available = available - %s WHERE sku = %s AND available >= %s",
            (command.quantity, command.sku, command.quantity),
        )
        if taken.rowcount == 0:
            replies.send(StockUnavailable(order_id=command.order_id, reason="not enough"))
            return
        sql.execute(
            "INSERT INTO reservation VALUES (%s, %s, %s)",
            (command.order_id, command.sku, command.quantity),
        )
        replies.send(StockReserved(order_id=command.order_id))


app = ParticipantApp(
    participants=[Inventory],
    migrations=[TABLES],
    settings={"participant": {"schema_name": "inventory", "group_id": "inventory"}},
)
