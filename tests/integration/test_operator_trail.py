"""The audit trail and operator requests against real Kafka and PostgreSQL, with the order saga.

`show --json` of an order whose payment timed out and that compensated lists every step in
order, with what each received and produced; an operator's cancel sent while the saga's last
reply is in flight is applied in log order, and exactly one of the two wins.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest

from processor._bootstrap.adapters import tables_for
from processor._cli import main
from processor._kafka.producer import KafkaRecordProducer, make_producer
from processor._postgres.reads.inspect import open_inspect_queries
from processor._wire import OperatorAction
from processor.ops._inspect import send_operator_request
from schemas.orders import (
    FraudReviewApproved,
    OrderShipped,
    PaymentCaptured,
    PaymentRefunded,
    StockReleased,
    StockReserved,
)
from tests.support.harness import running
from tests.support.orders import OPERATOR_KEY, SAGA_TYPE, Orders, make_orders
from tests.support.procs import settings_env

pytestmark = pytest.mark.integration


@pytest.fixture
def orders(kafka_bootstrap: str, database_url: str, pg_schema: str) -> Orders:
    return make_orders(kafka_bootstrap, database_url, pg_schema)


def _show(o: Orders, order: str, capsys: pytest.CaptureFixture[str], mp: pytest.MonkeyPatch) -> Any:
    for name, value in settings_env(o.settings).items():
        mp.setenv(name, value)
    capsys.readouterr()
    assert main(["show", SAGA_TYPE, order, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_show_json_lists_a_timed_out_and_compensated_order_step_by_step(
    orders: Orders, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    o, order = orders, f"o-{uuid.uuid4().hex[:8]}"
    with running(o.settings):
        o.place(order)
        o.send(StockReserved(order_id=order), order)
        o.wait_version(order, 2)
        # Nobody captures the payment: its 2 s timeout fires and the stock is released.
        wait_until_state(o, order, "COMPENSATING")
        o.send(StockReleased(order_id=order), order)
        o.wait_version(order, 4)
        # The capture lands late (the payment was in doubt): it is refunded, then the saga ends.
        o.send(PaymentCaptured(order_id=order), order)
        o.wait_version(order, 5)
        o.send(PaymentRefunded(order_id=order), order)
        o.wait_status(order, "ended")
    shown = _show(o, order, capsys, monkeypatch)
    assert shown["saga"]["status"] == "ended"
    assert shown["saga"]["machine_state"] == "COMPENSATED"
    steps = [(t["message_type"], t["outcome"], t["version"]) for t in shown["timeline"]]
    assert steps[0] == ("orders.OrderPlaced", "applied", 1)
    assert steps[1] == ("orders.StockReserved", "applied", 2)
    assert steps[2][0].startswith("deadline:")
    assert steps[2][1:] == ("applied", 3)
    assert [s[0] for s in steps[3:]] == [
        "orders.StockReleased",
        "orders.PaymentCaptured",
        "orders.PaymentRefunded",
    ]
    assert [s[1:] for s in steps[3:]] == [("applied", 4), ("applied", 5), ("applied", 6)]
    assert [t["id"] for t in shown["timeline"]] == sorted(t["id"] for t in shown["timeline"])
    placed, reserved, timeout = shown["timeline"][:3]
    # What each step received, as it came, and what it produced.
    assert json.loads(placed["payload"])["order_id"] == order
    assert placed["headers"]["message-type"] == "orders.OrderPlaced"
    assert [c["type"] for c in placed["effects"]["commands"]] == ["orders.ReserveStock"]
    assert any(d["op"] == "schedule" for d in placed["effects"]["deadlines"])
    assert [c["type"] for c in reserved["effects"]["commands"]] == ["orders.CapturePayment"]
    assert [c["type"] for c in timeout["effects"]["commands"]] == ["orders.ReleaseStock"]
    late = shown["timeline"][4]
    assert [c["type"] for c in late["effects"]["commands"]] == ["orders.RefundPayment"]
    assert shown["timeline"][-1]["effects"]["ended"] is True
    # The command ids in the trail are those the participants received.
    sent = o.db(
        "SELECT count(*) FROM saga_history WHERE saga_id = %s AND effects IS NOT NULL", order
    )
    assert sent[0][0] >= 4
    assert shown["deadlines"] == []
    assert shown["parked_messages"] == []


def wait_until_state(o: Orders, order: str, state: str, timeout: float = 60) -> None:
    from tests.support.harness import wait_until

    wait_until(
        lambda: (r := o.row(order)) is not None and r[1] == state,
        timeout=timeout,
        what=f"{order} in {state}",
    )


def test_a_cancel_racing_the_last_reply_is_applied_in_log_order(orders: Orders) -> None:
    o, order = orders, f"o-{uuid.uuid4().hex[:8]}"
    with running(o.settings):
        o.place(order)
        for version, reply in enumerate(
            (StockReserved, PaymentCaptured, FraudReviewApproved), start=2
        ):
            o.send(reply(order_id=order), order)
            o.wait_version(order, version)
        # The parcel is with the carrier; its reply and an operator's cancel race.
        url = o.settings.database.url.get_secret_value()
        with open_inspect_queries(url, tables_for(o.settings)) as queries:
            producer = KafkaRecordProducer(
                lambda: make_producer(
                    o.settings.kafka.client_config(),
                    partitioner=o.settings.consumer.partitioner,
                )
            )
            go = threading.Barrier(2)

            def cancel() -> None:
                go.wait()
                send_operator_request(
                    queries,
                    producer,
                    OPERATOR_KEY.encode(),
                    action=OperatorAction.CANCEL,
                    saga_type=SAGA_TYPE,
                    saga_id=order,
                    by="ops",
                    reason="customer called",
                )

            canceller = threading.Thread(target=cancel)
            canceller.start()
            go.wait()
            o.send(OrderShipped(order_id=order), order)
            canceller.join(30)
            producer.close(5)
        wait_until_both(o, order)
        rows = o.db(
            'SELECT kind, message_type, outcome, detail, "offset" FROM saga_history '
            "WHERE saga_id = %s AND message_type IN ('orders.OrderShipped', 'operator:cancel') "
            "ORDER BY id",
            order,
        )
        state = o.row(order)
    assert state is not None
    [first, second] = rows
    # History order is log order.
    assert first[4] < second[4]
    operator = first if first[0] == "operator" else second
    assert operator[3] == "operator cancel by ops: customer called"
    if first[0] == "operator":
        # The cancel won: the saga compensates; the parcel's reply came too late to complete it.
        assert first[2] == "applied"
        assert state[1] != "COMPLETED"
    else:
        # The reply won: the order completed and ended; the cancel found nothing to cancel.
        assert first[2] == "applied"
        assert second[2] == "ignored-ended"
        assert state[:2] == ("ended", "COMPLETED")


def wait_until_both(o: Orders, order: str) -> None:
    from tests.support.harness import wait_until

    wait_until(
        lambda: (
            o.db(
                "SELECT count(*) FROM saga_history WHERE saga_id = %s AND message_type IN "
                "('orders.OrderShipped', 'operator:cancel')",
                order,
            )[0][0]
            == 2
        ),
        timeout=60,
        what="the reply and the cancel recorded",
    )
