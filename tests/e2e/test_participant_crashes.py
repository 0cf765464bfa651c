"""Participants under fire: kill -9 at random points, PostgreSQL and the broker restarted.

The order saga runs in a processor process; the inventory, payment, fraud review and shipping
services run on the participant kit in another process, which is killed with SIGKILL at random
moments while orders flow and started again; then PostgreSQL restarts, then the broker. Only a
private PostgreSQL cluster and broker are restarted (see ``tests.support.private_stack``).

Afterwards every saga has ended and:
- every command was executed exactly once in effect: one inbox row per command message id, at
  most one payment and one reservation per order, and each order's net effect matches how its
  saga ended;
- every command got its reply, and a command answered more than once (redelivered after a
  crash) was answered with the very same reply (same message id);
- money and stock are conserved, end to end.
"""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from demo.orders import MERCHANT
from devstack import wait_for_kafka
from schemas.orders import (
    ESCALATIONS_TOPIC,
    ORDER_COMMANDS_TOPIC,
    ORDER_EVENTS_TOPIC,
    OrderPlaced,
)
from tests.support.harness import Publisher, Reader, create_topics, settings_for, wait_until
from tests.support.participants import ParticipantProcess
from tests.support.private_stack import PrivateStack
from tests.support.procs import ProcessorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

ORDERS_PER_WAVE = 30
PRICE = Decimal("10.00")
STOCK = 200
WALLETS = {"c-0": Decimal("5000.00"), "c-1": Decimal("5000.00"), "c-poor": Decimal("15.00")}


def _orders(wave: str) -> list[OrderPlaced]:
    customers = ["c-0", "c-1", "c-poor", "fraud-x"]
    return [
        OrderPlaced(
            order_id=f"{wave}-{i}",
            customer_id=customers[i % len(customers)],
            sku="sku-1",
            quantity=1,
            amount=PRICE,
        )
        for i in range(ORDERS_PER_WAVE)
    ]


class Chaos:
    """The participant process, restarted after every kill, and the processor, kept running."""

    def __init__(self, stack: PrivateStack, prefix: str, logs: Path) -> None:
        self.stack = stack
        self.prefix = prefix
        self.logs = logs
        self.kills = 0
        self.participants = self._participants(initial=True)
        settings = settings_for(
            stack.kafka,
            stack.database,
            "crash_saga",
            prefix,
            sagas=["sagas.order:OrderSaga"],
            # Long step timers: outcomes are decided by the services, not by the outages.
            settings={"order.payment-timeout": "PT10M", "order.review-timeout": "PT10M"},
        )
        self._settings = settings
        self.processors = [ProcessorProcess(settings, logs / "processor-0.log")]

    def _participants(self, *, initial: bool) -> ParticipantProcess:
        return ParticipantProcess(
            kafka=self.stack.kafka,
            database=self.stack.database,
            schema="crash_svc",
            prefix=self.prefix,
            log_path=self.logs / f"participants-{self.kills}.log",
            stock={"sku-1": STOCK} if initial else None,
            wallets={**WALLETS, "fraud-x": Decimal("5000.00")} if initial else None,
        )

    def kill_participants(self) -> None:
        self.participants.kill()
        self.kills += 1
        self.participants = self._participants(initial=False)

    def keep_processor(self) -> None:
        # A processor that exits (e.g. its database was gone too long) is started again, as a
        # platform would.
        if not self.processors[-1].alive():
            n = len(self.processors)
            self.processors.append(
                ProcessorProcess(self._settings, self.logs / f"processor-{n}.log")
            )

    def stop(self) -> None:
        self.participants.stop()
        for p in self.processors:
            p.stop()


def _sql(database: str, text: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(database) as conn:
        return conn.execute(text, args).fetchall()


def _ended(database: str) -> dict[str, str]:
    try:
        rows = _sql(
            database,
            "SELECT saga_id, machine_state FROM crash_saga.saga_instance WHERE status = 'ended'",
        )
    except psycopg.Error:
        return {}
    return {str(a): str(b) for a, b in rows}


def test_every_command_once_every_reply_money_conserved(
    private_stack: PrivateStack, tmp_path: Path
) -> None:
    stack = private_stack
    rng = random.Random(15)
    prefix = f"k{uuid.uuid4().hex[:6]}."
    create_topics(
        stack.kafka,
        [prefix + t for t in (ORDER_EVENTS_TOPIC, ORDER_COMMANDS_TOPIC, ESCALATIONS_TOPIC)]
        + [prefix + "saga-dead-letters"],
        partitions=3,
    )
    chaos = Chaos(stack, prefix, tmp_path)
    placed: list[OrderPlaced] = []

    def place(wave: str) -> None:
        pub = Publisher(stack.kafka)
        for order in _orders(wave):
            pub.event(prefix + ORDER_EVENTS_TOPIC, order.order_id, order)
            placed.append(order)
        pub.flush()

    def progressed(n: int) -> bool:
        chaos.keep_processor()
        return len(_ended(stack.database)) >= n

    try:
        place("w1")
        # kill -9 at random points (random amounts of progress) while the first wave flows.
        for threshold in sorted(rng.sample(range(1, ORDERS_PER_WAVE - 4), 4)):
            wait_until(partial(progressed, threshold), timeout=120, what=f"{threshold} ended")
            chaos.kill_participants()
        place("w2")
        # PostgreSQL goes away under load and comes back.
        stack.down("postgres")
        stack.up("postgres")
        place("w3")
        # Then the broker.
        stack.down("kafka")
        stack.up("kafka")
        wait_for_kafka(stack.kafka, timeout=120)
        chaos.kill_participants()
        wait_until(lambda: progressed(len(placed)), timeout=400, what="every order saga to end")
        events = Reader(stack.kafka, [prefix + ORDER_EVENTS_TOPIC])
        commands = Reader(stack.kafka, [prefix + ORDER_COMMANDS_TOPIC])
        wait_until(lambda: _drained(stack.database), timeout=120, what="the outboxes to drain")
    finally:
        chaos.stop()
    ended = _ended(stack.database)
    assert set(ended) == {o.order_id for o in placed}
    assert set(ended.values()) <= {"COMPLETED", "FAILED"}
    assert "COMPLETED" in ended.values()
    assert "FAILED" in ended.values()

    # Exactly once in effect: one inbox row per command (its primary key) ...
    db = stack.database
    inbox = dict(_sql(db, "SELECT message_id, outcome FROM crash_svc.inbox"))
    # "expired": a command that waited out an outage past its budget, answered as declared.
    assert set(inbox.values()) <= {"handled", "expired"}

    def command_ids() -> set[str]:
        return {commands.headers(m)["message-id"] for m in commands.records}

    def answers() -> defaultdict[str, set[str]]:
        out: defaultdict[str, set[str]] = defaultdict(set)
        for m in events.records:
            h = events.headers(m)
            if "causation-id" in h:
                out[h["causation-id"]].add(h["message-id"])
        return out

    try:
        commands.wait_for(lambda _: set(inbox) <= command_ids(), what="every command read")
        assert command_ids() == set(inbox), "a command was never consumed"
        # ... every command was answered, and a command answered twice (redelivered after a
        # crash) was answered with the very same reply.
        events.wait_for(lambda _: set(inbox) <= set(answers()), what="a reply to every command")
        assert all(len(answers()[mid]) == 1 for mid in inbox), "a command got two replies"
    finally:
        events.close()
        commands.close()

    payments = {
        str(o): bool(r) for o, r in _sql(db, "SELECT order_id, refunded FROM crash_svc.payment")
    }
    held = {
        str(o): bool(r) for o, r in _sql(db, "SELECT order_id, released FROM crash_svc.reservation")
    }
    shipped = {str(o) for (o,) in _sql(db, "SELECT order_id FROM crash_svc.shipment")}
    for oid, state in ended.items():
        if state == "COMPLETED":
            assert payments.get(oid) is False, oid
            assert held.get(oid) is False, oid
            assert oid in shipped, oid
        else:
            assert payments.get(oid, True) is True, oid  # never paid, or refunded
            assert held.get(oid, True) is True, oid  # never held, or released
            assert oid not in shipped, oid

    # Conservation, end to end.
    completed = sum(1 for s in ended.values() if s == "COMPLETED")
    wallets = dict(_sql(db, "SELECT owner, balance FROM crash_svc.wallet"))
    start = sum(WALLETS.values()) + Decimal("5000.00")
    assert sum(wallets.values()) == start
    assert wallets[MERCHANT] == PRICE * completed
    [(available,)] = _sql(db, "SELECT available FROM crash_svc.stock")
    assert available + completed == STOCK
    assert chaos.kills >= 5


def _drained(database: str) -> bool:
    try:
        rows = _sql(
            database,
            "SELECT (SELECT count(*) FROM crash_svc.outbox) + (SELECT count(*) FROM "
            "crash_saga.outbox)",
        )
    except psycopg.Error:
        return False
    return rows == [(0,)]
