"""The inventory service of docs/participants.md, tested as a user would: ParticipantFixture."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

from demo.inventory_service import TABLES, Inventory, app
from processor.testing import ParticipantFixture
from schemas.orders import ReserveStock, StockReservationFailed, StockReserved, StockUnavailable

DOCS = Path(__file__).resolve().parents[2] / "docs" / "participants.md"
SERVICE = Path(__file__).resolve().parents[2] / "demo" / "inventory_service.py"


def _reserve(order: str, quantity: int = 2) -> ReserveStock:
    return ReserveStock(
        order_id=order, customer_id="c-1", sku="sku-1", quantity=quantity, amount=Decimal("5")
    )


def _fixture() -> ParticipantFixture:
    fx = ParticipantFixture(Inventory, schema=TABLES)
    fx.sql("INSERT INTO stock VALUES (%s, %s)", ("sku-1", 3))
    return fx


def test_the_docs_show_the_service_as_it_is() -> None:
    block = re.search(r"```python\n# demo/inventory_service.py\n(.*?)```", DOCS.read_text(), re.S)
    assert block is not None
    body = SERVICE.read_text().split("\n", 2)[2]  # after its docstring line and the blank
    assert block.group(1) == body
    assert len(SERVICE.read_text().splitlines()) < 60
    assert app.migrations == (TABLES,)


def test_a_reservation_takes_the_stock_once_however_often_it_is_delivered() -> None:
    fx = _fixture()
    first = fx.given_command(_reserve("o-1"), saga_type="order-saga", saga_id="o-1")
    first.expect_reply(StockReserved(order_id="o-1"))
    again = first.redeliver()
    again.expect_reply(StockReserved(order_id="o-1"))
    assert [r.message_id for r in again.replies] == [r.message_id for r in first.replies]
    assert fx.sql("SELECT available FROM stock") == [(1,)]
    # The saga's retry is a new command: answered alike, the stock taken once.
    retry = fx.given_command(_reserve("o-1"), saga_type="order-saga", saga_id="o-1")
    retry.expect_reply(StockReserved(order_id="o-1"))
    assert fx.sql("SELECT available FROM stock") == [(1,)]


def test_not_enough_stock_and_a_command_past_its_budget() -> None:
    fx = _fixture()
    fx.given_command(_reserve("o-2", 5), saga_type="order-saga", saga_id="o-2").expect_reply(
        StockUnavailable(order_id="o-2", reason="not enough")
    )
    late = fx.given_command(
        _reserve("o-3"), saga_type="order-saga", saga_id="o-3", deadline=timedelta(seconds=1)
    )
    late.expect_reply(StockReserved(order_id="o-3"))
    fx.when_time_elapses(timedelta(seconds=5))
    expired = fx.given_command(
        _reserve("o-4"), saga_type="order-saga", saga_id="o-4", deadline=timedelta(seconds=-1)
    )
    expired.expect_reply(StockReservationFailed(order_id="o-4", reason="expired"))
    assert fx.sql("SELECT available FROM stock") == [(1,)]
