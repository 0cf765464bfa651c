"""`show`'s step in flight, `show --follow` and `sagas list`'s filters on Kafka and PostgreSQL.

An order's shipping fails once: `show --json` says the second attempt is out and why the first
failed. `show --follow` then prints the rows as the processor commits them and stops by itself
once the shipment ends the saga. `sagas list` pages by the cursor it prints.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
import uuid

import pytest

from processor._cli import main
from schemas.orders import (
    FraudReviewApproved,
    OrderShipped,
    PaymentCaptured,
    ShipmentFailed,
    StockReserved,
)
from tests.support.harness import running
from tests.support.orders import SAGA_TYPE, Orders, make_orders
from tests.support.procs import settings_env

pytestmark = pytest.mark.integration


@pytest.fixture
def orders(kafka_bootstrap: str, database_url: str, pg_schema: str) -> Orders:
    return make_orders(kafka_bootstrap, database_url, pg_schema)


def test_show_says_the_attempt_and_last_failure_then_follows_to_the_end(
    orders: Orders, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    o = orders
    order, other = (f"o-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for name, value in settings_env(o.settings).items():
        monkeypatch.setenv(name, value)

    def cli(line: str) -> int:
        return main(shlex.split(line))

    with running(o.settings):
        o.place(order)
        o.place(other)
        for version, reply in enumerate((StockReserved, PaymentCaptured, FraudReviewApproved), 2):
            o.send(reply(order_id=order), order)
            o.wait_version(order, version)
        o.send(ShipmentFailed(order_id=order, reason="carrier down"), order)
        o.wait_version(order, 6)  # the failure, then the retry 0.2 s later
        capsys.readouterr()
        assert cli(f"show {SAGA_TYPE} {order} --json") == 0
        step = json.loads(capsys.readouterr().out)["step"]
        assert (step["step"], step["phase"], step["attempt"], step["waiting"]) == (
            "ship",
            "forward",
            2,
            "timeout",
        )
        assert step["due_at"] is not None
        assert step["last_failure"] == "step ship failed: carrier down"
        assert cli(f"show {SAGA_TYPE} {order}") == 0
        text = capsys.readouterr().out
        assert "step      ship, attempt 2, times out " in text
        assert "failure   step ship failed: carrier down" in text

        shipper = threading.Timer(1.5, o.send, (OrderShipped(order_id=order), order))
        shipper.start()
        began = time.monotonic()
        try:
            assert cli(f"show {SAGA_TYPE} {order} --follow --follow-seconds 60") == 0
        finally:
            shipper.join()
        assert time.monotonic() - began < 30  # stopped at the end, not at the bound
        followed = capsys.readouterr().out.split("timeline:", 1)[1]
        assert "orders.OrderShipped" in followed
        assert followed.rstrip().endswith("saga ended")
        assert o.row(order)[:2] == ("ended", "COMPLETED")  # type: ignore[index]
        # Bounded, on a saga that does not move: back after the seconds, exit 0.
        began = time.monotonic()
        assert cli(f"show {SAGA_TYPE} {other} --follow --follow-seconds 1.5") == 0
        assert 1.4 < time.monotonic() - began < 10

    # The console's filters, and a cursor to the next page.
    capsys.readouterr()
    assert cli(f"sagas list --type {SAGA_TYPE} --outcome COMPLETED --json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [s["saga_id"] for s in listed["sagas"]] == [order]
    assert listed["next"] is None
    seen = []
    after = ""
    while True:
        assert cli(f"sagas list --type {SAGA_TYPE} --limit 1 --json {after}") == 0
        page = json.loads(capsys.readouterr().out)
        seen += [s["saga_id"] for s in page["sagas"]]
        if page["next"] is None:
            break
        after = f"--after {shlex.quote(page['next'])}"
    assert sorted(seen) == sorted([order, other])
    assert (
        cli(f"sagas list --type {SAGA_TYPE} --status active --state-contains order_id={other}") == 0
    )
    assert other in capsys.readouterr().out
    assert cli("sagas list --outcome DONE") == 2
    assert "bad --outcome: one of" in capsys.readouterr().err
