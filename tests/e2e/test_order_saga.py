"""The order saga as users run it: a processor process, real Kafka and PostgreSQL.

The test plays the inventory, payment, review and shipping services: it reads commands from the
command topic and publishes their replies. Timers are shortened through the saga's settings.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from processor.messages import Message
from processor.ops.machines import machine_summary
from processor.postgres.connect import connect
from processor.postgres.operator import OperatorQueries
from processor.postgres.schema import Tables
from schemas.orders import (
    ESCALATIONS_TOPIC,
    ORDER_COMMANDS_TOPIC,
    ORDER_EVENTS_TOPIC,
    FraudReviewApproved,
    OrderPlaced,
    OrderShipped,
    PaymentCaptured,
    PaymentRefunded,
    StockReleased,
    StockReserved,
)
from tests.support.harness import Publisher, Reader, create_topics, query, settings_for, wait_until
from tests.support.procs import ProcessorProcess

pytestmark = [pytest.mark.e2e]

ORDER_SAGA = "sagas.order:OrderSaga"
TIMEOUT = 90.0


@dataclass
class OrderEnv:
    """One test's topics, schema, processor process and readers."""

    kafka: str
    db: str
    schema: str
    prefix: str
    logs: Path
    publisher: Publisher
    procs: list[ProcessorProcess]
    readers: list[Reader]

    def start(self, **saga_settings: str) -> ProcessorProcess:
        settings = settings_for(
            self.kafka,
            self.db,
            self.schema,
            self.prefix,
            sagas=[ORDER_SAGA],
            settings=saga_settings,
        )
        proc = ProcessorProcess(
            settings, self.logs / f"processor-{len(self.procs)}.log", app="sagas.app:order_app"
        )
        self.procs.append(proc)
        return proc

    def reader(self, topic: str) -> Reader:
        reader = Reader(self.kafka, [self.prefix + topic])
        self.readers.append(reader)
        return reader

    def reply(self, order_id: str, message: Message) -> None:
        self.publisher.event(self.prefix + ORDER_EVENTS_TOPIC, order_id, message)
        self.publisher.flush()

    def machine(self, order_id: str) -> tuple[Any, ...] | None:
        rows = query(
            self.db,
            self.schema,
            "SELECT machine_state, status FROM saga_instance WHERE saga_id = %s",
            order_id,
        )
        return rows[0] if rows else None

    def wait_machine(self, order_id: str, machine_state: str, status: str = "active") -> None:
        wait_until(
            lambda: self.machine(order_id) == (machine_state, status),
            timeout=TIMEOUT,
            what=f"{order_id} in {machine_state}/{status}",
        )


@pytest.fixture
def order_env(
    kafka_bootstrap: str, database_url: str, pg_schema: str, tmp_path: Path
) -> Iterator[OrderEnv]:
    prefix = f"o{uuid.uuid4().hex[:8]}."
    create_topics(
        kafka_bootstrap,
        [prefix + t for t in (ORDER_EVENTS_TOPIC, ORDER_COMMANDS_TOPIC, ESCALATIONS_TOPIC)]
        + [prefix + "saga-dead-letters"],
        partitions=3,
    )
    env = OrderEnv(
        kafka_bootstrap,
        database_url,
        pg_schema,
        prefix,
        tmp_path,
        Publisher(kafka_bootstrap),
        [],
        [],
    )
    try:
        yield env
    finally:
        for proc in env.procs:
            proc.stop()
        for reader in env.readers:
            reader.close()


def _types(reader: Reader, order_id: str) -> list[str]:
    return [
        reader.headers(m)["message-type"]
        for m in reader.records
        if reader.headers(m).get("saga-id") == order_id
    ]


def _expect(reader: Reader, order_id: str, types: list[str]) -> Callable[[], list[Any]]:
    return lambda: reader.wait_for(
        lambda _: _types(reader, order_id) == types, timeout=TIMEOUT, what=f"commands {types}"
    )


def _placed(order_id: str) -> OrderPlaced:
    return OrderPlaced(
        order_id=order_id, customer_id="c-1", sku="sku-1", quantity=1, amount=Decimal("25.00")
    )


def test_happy_path_completes_and_commands_carry_deadlines(order_env: OrderEnv) -> None:
    env = order_env
    commands = env.reader(ORDER_COMMANDS_TOPIC)
    oid = f"ord-{uuid.uuid4().hex[:6]}"
    env.start()
    env.reply(oid, _placed(oid))
    _expect(commands, oid, ["orders.ReserveStock"])()
    env.wait_machine(oid, "RUNNING")
    env.reply(oid, StockReserved(order_id=oid))
    _expect(commands, oid, ["orders.ReserveStock", "orders.CapturePayment"])()
    env.reply(oid, PaymentCaptured(order_id=oid))
    flow = ["orders.ReserveStock", "orders.CapturePayment", "orders.RequestFraudReview"]
    _expect(commands, oid, flow)()
    env.wait_machine(oid, "WAITING")
    env.reply(oid, FraudReviewApproved(order_id=oid))
    _expect(commands, oid, [*flow, "orders.ShipOrder"])()
    env.reply(oid, OrderShipped(order_id=oid))
    env.wait_machine(oid, "COMPLETED", "ended")

    for msg in commands.records:
        headers = commands.headers(msg)
        assert int(headers["deadline-unix-ms"]) > 0, headers
    assert query(env.db, env.schema, "SELECT count(*) FROM saga_deadline") == [(0,)]


def test_payment_timeout_compensates_and_a_late_capture_is_refunded(order_env: OrderEnv) -> None:
    env = order_env
    commands = env.reader(ORDER_COMMANDS_TOPIC)
    oid = f"ord-{uuid.uuid4().hex[:6]}"
    env.start(**{"order.payment-timeout": "PT2S"})
    env.reply(oid, _placed(oid))
    _expect(commands, oid, ["orders.ReserveStock"])()
    env.reply(oid, StockReserved(order_id=oid))
    # No payment reply: the step timer fires and the reservation is released.
    flow = ["orders.ReserveStock", "orders.CapturePayment", "orders.ReleaseStock"]
    _expect(commands, oid, flow)()
    env.wait_machine(oid, "COMPENSATING")
    env.reply(oid, StockReleased(order_id=oid))
    # The capture landed after all: it is refunded, then the saga fails cleanly.
    env.reply(oid, PaymentCaptured(order_id=oid))
    _expect(commands, oid, [*flow, "orders.RefundPayment"])()
    env.reply(oid, PaymentRefunded(order_id=oid))
    env.wait_machine(oid, "FAILED", "ended")
    [(state,)] = query(env.db, env.schema, "SELECT state FROM saga_instance")
    assert state["progress"]["late"] == ["pay:undo"]
    assert [t["target"] for t in state["machine"]["transitions"]] == [
        "RUNNING",
        "COMPENSATING",
        "FAILED",
    ]


def test_fraud_review_timeout_escalates_to_a_person(order_env: OrderEnv) -> None:
    env = order_env
    commands = env.reader(ORDER_COMMANDS_TOPIC)
    escalations = env.reader(ESCALATIONS_TOPIC)
    oid = f"ord-{uuid.uuid4().hex[:6]}"
    env.start(**{"order.review-timeout": "PT2S"})
    env.reply(oid, _placed(oid))
    _expect(commands, oid, ["orders.ReserveStock"])()
    env.reply(oid, StockReserved(order_id=oid))
    _expect(commands, oid, ["orders.ReserveStock", "orders.CapturePayment"])()
    env.reply(oid, PaymentCaptured(order_id=oid))
    escalations.wait_for(lambda rs: len(rs) >= 1, timeout=TIMEOUT, what="an escalation")
    [msg] = escalations.records
    assert escalations.headers(msg)["message-type"] == "orders.EscalateToPerson"
    assert b'"approval-timeout"' in msg.value()
    # Escalating does not give up: the saga still waits for the analyst.
    env.wait_machine(oid, "WAITING")
    with connect(env.db, autocommit=True) as conn:
        summary = machine_summary(OperatorQueries(conn, Tables(env.schema)))
    assert [(r.saga_type, r.machine_state, r.count) for r in summary.states] == [
        ("order-saga", "WAITING", 1)
    ]
    assert (summary.timed_out, summary.compensation_failed) == (0, 0)
