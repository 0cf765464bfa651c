"""The participant kit against real Kafka and PostgreSQL: once in effect, same replies, budgets."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from demo.orders import DDL, EXPIRED, order_participants, stock_up
from processor._authoring.messages import Message
from processor._bootstrap.participant import ParticipantService
from processor.settings import ConsumerSettings, RelaySettings
from schemas.orders import (
    ORDER_COMMANDS_TOPIC,
    ORDER_EVENTS_TOPIC,
    CapturePayment,
    RequestFraudReview,
    ReserveStock,
)
from tests.support.harness import Publisher, Reader, create_topics, query, wait_until

pytestmark = [pytest.mark.integration]

DEAD = "saga-dead-letters"


@dataclass
class Env:
    prefix: str
    schema: str
    db: str
    publisher: Publisher
    events: Reader
    dead: Reader
    service: ParticipantService

    def send(self, command: Message, message_id: str, **headers: str) -> None:
        oid = str(getattr(command, "order_id"))  # noqa: B009
        base = {"saga-type": "order-saga", "saga-id": oid, "correlation-id": f"corr-{oid}"}
        self.publisher.event(
            self.prefix + ORDER_COMMANDS_TOPIC, oid, command, message_id, **{**base, **headers}
        )
        self.publisher.flush()

    def replies(self, oid: str) -> list[Any]:
        return [m for m in self.events.records if m.key() == oid.encode()]

    def wait_replies(self, oid: str, n: int) -> list[Any]:
        self.events.wait_for(lambda _: len(self.replies(oid)) >= n, what=f"{n} replies")
        return self.replies(oid)

    def sql(self, text: str, *args: Any) -> list[tuple[Any, ...]]:
        return query(self.db, self.schema, text, *args)


@pytest.fixture
def env(kafka_bootstrap: str, database_url: str, pg_schema: str) -> Iterator[Env]:
    prefix = f"p{uuid.uuid4().hex[:8]}."
    create_topics(
        kafka_bootstrap,
        [prefix + t for t in (ORDER_COMMANDS_TOPIC, ORDER_EVENTS_TOPIC, DEAD)],
        partitions=2,
    )
    service = ParticipantService(
        order_participants(),
        kafka={"bootstrap.servers": kafka_bootstrap},
        database_url=database_url,
        schema=pg_schema,
        group_id=f"{prefix}participants",
        topic_prefix=prefix,
        consumer=ConsumerSettings(session_timeout="PT6S"),
        relay=RelaySettings(poll_interval="PT0.2S"),
    )
    # The handle the handlers get finds the service's schema first: no schema in their SQL.
    with service.store.transaction() as tx:
        tx.sql.execute(DDL)
        stock_up(tx.sql, {"sku-1": 5}, {"c-1": Decimal("100.00")})
    stop = threading.Event()
    thread = threading.Thread(target=service.run, args=(stop,), daemon=True)
    thread.start()
    e = Env(
        prefix,
        pg_schema,
        database_url,
        Publisher(kafka_bootstrap),
        Reader(kafka_bootstrap, [prefix + ORDER_EVENTS_TOPIC]),
        Reader(kafka_bootstrap, [prefix + DEAD]),
        service,
    )
    try:
        yield e
    finally:
        stop.set()
        thread.join(30)
        service.close()
        e.events.close()
        e.dead.close()
    assert not thread.is_alive()


def _facts(oid: str, amount: str = "25.00", customer: str = "c-1") -> dict[str, Any]:
    return {
        "order_id": oid,
        "customer_id": customer,
        "sku": "sku-1",
        "quantity": 2,
        "amount": Decimal(amount),
    }


def _future_ms() -> str:
    return str(int((time.time() + 60) * 1000))


def test_reply_carries_saga_key_correlation_and_causation(env: Env) -> None:
    oid = f"o-{uuid.uuid4().hex[:6]}"
    mid = str(uuid.uuid4())
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    env.send(
        ReserveStock(**_facts(oid)), mid, traceparent=trace, **{"deadline-unix-ms": _future_ms()}
    )
    [reply] = env.wait_replies(oid, 1)
    h = env.events.headers(reply)
    assert h["message-type"] == "orders.StockReserved"
    assert (h["saga-type"], h["saga-id"]) == ("order-saga", oid)
    assert h["correlation-id"] == f"corr-{oid}"
    assert h["causation-id"] == mid
    assert h["traceparent"] == trace
    assert h["message-id"] != mid
    assert h["schema-version"] == "1"
    assert h["occurred-at"]
    assert env.sql("SELECT available FROM stock WHERE sku = 'sku-1'") == [(3,)]


def test_redelivered_command_has_no_second_effect_and_the_same_reply(env: Env) -> None:
    oid = f"o-{uuid.uuid4().hex[:6]}"
    mid = str(uuid.uuid4())
    env.send(CapturePayment(**_facts(oid)), mid)
    [first] = env.wait_replies(oid, 1)
    env.send(CapturePayment(**_facts(oid)), mid)
    _, second = env.wait_replies(oid, 2)
    assert env.events.headers(second) == env.events.headers(first)
    assert second.value() == first.value()
    balances = dict(env.sql("SELECT owner, balance FROM wallet"))
    assert balances == {"c-1": Decimal("75.00"), "merchant": Decimal("25.00")}
    assert env.sql("SELECT outcome FROM inbox WHERE message_id = %s", mid) == [("handled",)]


def test_expired_command_is_not_run_and_gets_its_declared_reply(env: Env) -> None:
    oid = f"o-{uuid.uuid4().hex[:6]}"
    past = str(int((time.time() - 1) * 1000))
    env.send(CapturePayment(**_facts(oid)), str(uuid.uuid4()), **{"deadline-unix-ms": past})
    [reply] = env.wait_replies(oid, 1)
    assert env.events.headers(reply)["message-type"] == "orders.PaymentDeclined"
    assert EXPIRED.encode() in reply.value()
    assert dict(env.sql("SELECT owner, balance FROM wallet"))["c-1"] == Decimal("100.00")

    # Declared DROP: no reply at all, recorded as dropped.
    dropped = f"o-{uuid.uuid4().hex[:6]}"
    mid = str(uuid.uuid4())
    env.send(RequestFraudReview(**_facts(dropped)), mid, **{"deadline-unix-ms": past})
    wait_until(
        lambda: env.sql("SELECT outcome FROM inbox WHERE message_id = %s", mid) == [("dropped",)],
        what="the dropped command recorded",
    )
    assert env.sql("SELECT count(*) FROM review") == [(0,)]
    env.events.poll()
    assert env.replies(dropped) == []


def test_bad_commands_are_dead_lettered_once(env: Env) -> None:
    topic = env.prefix + ORDER_COMMANDS_TOPIC
    env.publisher.raw(
        topic,
        b"k1",
        b"{not json",
        [("message-type", b"orders.ReserveStock"), ("message-id", b"m-bad")],
    )
    env.publisher.raw(
        topic, b"k2", b"{}", [("message-type", b"orders.Nope"), ("message-id", b"m-unknown")]
    )
    env.publisher.flush()
    env.dead.wait_for(lambda rs: len(rs) >= 2, what="two dead letters")
    reasons = sorted(env.dead.headers(m)["dead-letter-reason"] for m in env.dead.records)
    assert reasons == ["unknown-type", "unparseable"]
    assert all(env.dead.headers(m)["source-topic"] == topic for m in env.dead.records)
