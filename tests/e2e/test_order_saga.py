"""The order saga as users run it: a processor process, real Kafka and PostgreSQL.

The inventory, payment, fraud review and shipping services are the demo's participants on the
participant kit (``demo.orders``), run as a process. Where a test needs a service to stay
silent or to answer late (the saga's own timers), the test plays that service itself: it reads
commands from the command topic and publishes the replies. Timers are shortened through the
saga's settings.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from demo.orders import EXPIRED, MERCHANT
from processor._authoring.messages import Message
from processor._postgres.connect import connect
from processor._postgres.reads.operator import OperatorQueries
from processor._postgres.schema.tables import Tables
from processor.ops._machines import machine_summary
from schemas.orders import (
    ESCALATIONS_TOPIC,
    ORDER_COMMANDS_TOPIC,
    ORDER_EVENTS_TOPIC,
    OrderPlaced,
    PaymentCaptured,
    PaymentRefunded,
    StockReleased,
    StockReserved,
)
from tests.support.harness import Publisher, Reader, create_topics, query, settings_for, wait_until
from tests.support.participants import ParticipantProcess
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
    services: list[ParticipantProcess]
    svc_schema: str

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

    def participants(self, *only: str, initial: bool = True) -> ParticipantProcess:
        """The order participants named (all when none), in this test's service schema."""
        proc = ParticipantProcess(
            kafka=self.kafka,
            database=self.db,
            schema=self.svc_schema,
            prefix=self.prefix,
            log_path=self.logs / f"participants-{len(self.services)}.log",
            only=only,
            group=f"{self.prefix}{'-'.join(only) or 'all'}",
            stock={"sku-1": 10} if initial else None,
            wallets={"c-1": Decimal("100.00")} if initial else None,
        )
        self.services.append(proc)
        return proc

    def svc(self, text: str, *args: Any) -> list[tuple[Any, ...]]:
        return query(self.db, self.svc_schema, text, *args)

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
        [],
        f"{pg_schema}_svc",
    )
    try:
        yield env
    finally:
        for service in env.services:
            service.stop()
        for proc in env.procs:
            proc.stop()
        for reader in env.readers:
            reader.close()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(env.svc_schema))
            )


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


def _replies_by_cause(reader: Reader) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for m in reader.records:
        h = reader.headers(m)
        out.setdefault(h.get("causation-id", ""), []).append(h)
    return out


def _command_ids(reader: Reader, oid: str, types: Sequence[str] = ()) -> list[str]:
    return [
        reader.headers(m)["message-id"]
        for m in reader.records
        if reader.headers(m).get("saga-id") == oid
        and (not types or reader.headers(m)["message-type"] in types)
    ]


def test_happy_path_with_the_participants(order_env: OrderEnv) -> None:
    env = order_env
    commands = env.reader(ORDER_COMMANDS_TOPIC)
    events = env.reader(ORDER_EVENTS_TOPIC)
    oid = f"ord-{uuid.uuid4().hex[:6]}"
    env.participants()
    env.start()
    env.reply(oid, _placed(oid))
    commands.wait_for(lambda _: bool(_types(commands, oid)), what="the first command")
    env.wait_machine(oid, "COMPLETED", "ended")
    flow = [
        "orders.ReserveStock",
        "orders.CapturePayment",
        "orders.RequestFraudReview",
        "orders.ShipOrder",
    ]
    _expect(commands, oid, flow)()
    for msg in commands.records:
        headers = commands.headers(msg)
        assert int(headers["deadline-unix-ms"]) > 0, headers
    assert query(env.db, env.schema, "SELECT count(*) FROM saga_deadline") == [(0,)]
    # Each command was answered once, by a reply that names it and carries the saga key.
    ids = _command_ids(commands, oid)
    events.wait_for(lambda _: set(ids) <= set(_replies_by_cause(events)), what="every reply")
    by_cause = _replies_by_cause(events)
    for mid in ids:
        [reply] = by_cause[mid]
        assert (reply["saga-type"], reply["saga-id"]) == ("order-saga", oid)
        assert reply["correlation-id"]
    assert env.svc("SELECT available FROM stock") == [(9,)]
    wallets = dict(env.svc("SELECT owner, balance FROM wallet"))
    assert wallets == {"c-1": Decimal("75.00"), MERCHANT: Decimal("25.00")}


def test_expired_capture_is_not_run_and_the_saga_compensates(order_env: OrderEnv) -> None:
    env = order_env
    commands = env.reader(ORDER_COMMANDS_TOPIC)
    events = env.reader(ORDER_EVENTS_TOPIC)
    oid = f"ord-{uuid.uuid4().hex[:6]}"
    env.participants("inventory", "fraud-review", "shipping")
    env.start(**{"order.payment-timeout": "PT2S"})
    env.reply(oid, _placed(oid))
    commands.wait_for(
        lambda _: "orders.CapturePayment" in _types(commands, oid), what="the capture command"
    )
    [capture] = [
        m
        for m in commands.records
        if commands.headers(m)["message-type"] == "orders.CapturePayment"
        and commands.headers(m).get("saga-id") == oid
    ]
    budget = int(commands.headers(capture)["deadline-unix-ms"])
    wait_until(lambda: time.time() * 1000 > budget + 100, timeout=30, what="the budget to pass")
    # The payment service comes up only now: the capture is past its budget.
    env.participants("payment", initial=False)
    mid = commands.headers(capture)["message-id"]
    events.wait_for(lambda _: mid in _replies_by_cause(events), what="the declared expired reply")
    [reply] = _replies_by_cause(events)[mid]
    assert reply["message-type"] == "orders.PaymentDeclined"
    [declined] = [m for m in events.records if events.headers(m).get("causation-id") == mid]
    assert EXPIRED.encode() in declined.value()
    # The saga's own timer compensated; the declared reply settles the step it was unsure of.
    env.wait_machine(oid, "COMPENSATED", "ended")
    [(state,)] = query(env.db, env.schema, "SELECT state FROM saga_instance")
    assert state["progress"]["late"] == ["pay:rejected-resolved"]
    assert env.svc("SELECT outcome FROM inbox WHERE message_id = %s", mid) == [("expired",)]
    # Nothing was taken, and the compensation put the stock back.
    assert dict(env.svc("SELECT owner, balance FROM wallet"))["c-1"] == Decimal("100.00")
    assert env.svc("SELECT count(*) FROM payment") == [(0,)]
    wait_until(lambda: env.svc("SELECT available FROM stock") == [(10,)], what="stock released")


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
    # The capture landed after all: it is refunded, then the saga ends COMPENSATED.
    env.reply(oid, PaymentCaptured(order_id=oid))
    _expect(commands, oid, [*flow, "orders.RefundPayment"])()
    env.reply(oid, PaymentRefunded(order_id=oid))
    env.wait_machine(oid, "COMPENSATED", "ended")
    [(state,)] = query(env.db, env.schema, "SELECT state FROM saga_instance")
    assert state["progress"]["late"] == ["pay:undo"]
    assert [t["target"] for t in state["machine"]["transitions"]] == [
        "RUNNING",
        "COMPENSATING",
        "COMPENSATED",
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
