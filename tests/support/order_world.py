"""The order saga and its participants on a private stack, and the end-to-end books check.

The order saga runs in processor processes (``schema.saga``); the inventory, payment, fraud
review and shipping services run on the participant kit in other processes (``schema.svc``).
Tests disturb them (kill -9, restarts, a broker taken away, SIGTERM) and then ask
:func:`assert_books` whether every command took effect exactly once and money and stock are
conserved.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

from demo.orders import MERCHANT
from processor.settings import ProcessorSettings
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

PRICE = Decimal("10.00")
STOCK = 200
WALLETS = {
    "c-0": Decimal("5000.00"),
    "c-1": Decimal("5000.00"),
    "c-poor": Decimal("15.00"),
    "fraud-x": Decimal("5000.00"),
}
CUSTOMERS = ("c-0", "c-1", "c-poor", "fraud-x")


def sql(database: str, text: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(database) as conn:
        return conn.execute(text, args).fetchall()


@dataclass
class OrderWorld:
    """One test's order saga, participants and what it placed, on ``stack``.

    Attributes:
        saga: Schema of the order saga's tables.
        svc: Schema of the participants' tables.
        processors: Every processor process started, the current one last.
        participants: Every participant process started, the current one last.
        placed: Every order published.
    """

    stack: PrivateStack
    logs: Path
    settings: ProcessorSettings
    prefix: str
    saga: str
    svc: str
    # Seconds a participant service's stop may take; None: the service's default.
    participant_budget: float | None = None
    processors: list[ProcessorProcess] = field(default_factory=list)
    participants: list[ParticipantProcess] = field(default_factory=list)
    placed: list[OrderPlaced] = field(default_factory=list)

    def start_processor(self, fault: Mapping[str, str] | None = None) -> ProcessorProcess:
        n = len(self.processors)
        proc = ProcessorProcess(self.settings, self.logs / f"processor-{n}.log", fault=fault)
        self.processors.append(proc)
        return proc

    def start_participants(self, fault: Mapping[str, str] | None = None) -> ParticipantProcess:
        n = len(self.participants)
        proc = ParticipantProcess(
            kafka=self.stack.kafka,
            database=self.stack.database,
            schema=self.svc,
            prefix=self.prefix,
            log_path=self.logs / f"participants-{n}.log",
            # The first process sets the stock and the wallets; later ones keep what is there.
            stock={"sku-1": STOCK} if n == 0 else None,
            wallets=WALLETS if n == 0 else None,
            fault=fault,
            shutdown_timeout=self.participant_budget,
        )
        self.participants.append(proc)
        return proc

    def place(self, wave: str, count: int) -> None:
        pub = Publisher(self.stack.kafka)
        for i in range(count):
            order = OrderPlaced(
                order_id=f"{wave}-{i}",
                customer_id=CUSTOMERS[i % len(CUSTOMERS)],
                sku="sku-1",
                quantity=1,
                amount=PRICE,
            )
            pub.event(self.prefix + ORDER_EVENTS_TOPIC, order.order_id, order)
            self.placed.append(order)
        pub.flush()

    def ended(self) -> dict[str, str]:
        """Ended sagas' machine states by order id ({} while the database does not answer)."""
        try:
            rows = sql(
                self.stack.database,
                f"SELECT saga_id, machine_state FROM {self.saga}.saga_instance "
                "WHERE status = 'ended'",
            )
        except psycopg.Error:
            return {}
        return {str(a): str(b) for a, b in rows}

    def drained(self) -> bool:
        """Both outboxes are empty."""
        try:
            rows = sql(
                self.stack.database,
                f"SELECT (SELECT count(*) FROM {self.svc}.outbox) "
                f"+ (SELECT count(*) FROM {self.saga}.outbox)",
            )
        except psycopg.Error:
            return False
        return rows == [(0,)]

    def wait_all_ended(self, timeout: float) -> None:
        want = {o.order_id for o in self.placed}
        wait_until(
            lambda: set(self.ended()) >= want, timeout=timeout, what="every order saga to end"
        )
        wait_until(self.drained, timeout=120, what="the outboxes to drain")

    def stop(self) -> None:
        for p in self.participants:
            p.stop()
        for q in self.processors:
            q.stop()


def order_world(
    stack: PrivateStack,
    logs: Path,
    *,
    saga: str = "orders_saga",
    svc: str = "orders_svc",
    shutdown_timeout: float | None = None,
) -> OrderWorld:
    """Creates this world's topics; starts nothing.

    ``shutdown_timeout``: seconds a stop of the processor and of the participant service may
    take (default: the tests' 10 s and the service's own default).
    """
    prefix = f"k{uuid.uuid4().hex[:6]}."
    create_topics(
        stack.kafka,
        [prefix + t for t in (ORDER_EVENTS_TOPIC, ORDER_COMMANDS_TOPIC, ESCALATIONS_TOPIC)]
        + [prefix + "saga-dead-letters"],
        partitions=3,
    )
    settings = settings_for(
        stack.kafka,
        stack.database,
        saga,
        prefix,
        sagas=["sagas.order:OrderSaga"],
        # Long step timers: outcomes are decided by the services, not by the outages.
        settings={"order.payment-timeout": "PT10M", "order.review-timeout": "PT10M"},
        **({} if shutdown_timeout is None else {"shutdown_timeout": f"{shutdown_timeout}s"}),
    )
    return OrderWorld(stack, logs, settings, prefix, saga, svc, shutdown_timeout)


def assert_books(world: OrderWorld) -> None:
    """Every saga ended, every command took effect once and got one reply (or was dropped, past
    its deadline, as its handler declares), and the books balance."""
    db = world.stack.database
    ended = world.ended()
    assert set(ended) == {o.order_id for o in world.placed}
    # A declined payment or a fraud rejection undoes the reservation (COMPENSATED); FAILED only
    # if a first step gave up with nothing to undo.
    assert set(ended.values()) <= {"COMPLETED", "COMPENSATED", "FAILED"}
    assert "COMPLETED" in ended.values()
    assert "COMPENSATED" in ended.values()

    # Exactly once in effect: one inbox row per command (its primary key) ...
    rows = sql(db, f"SELECT message_id, message_type, outcome FROM {world.svc}.inbox")
    inbox = {str(mid): str(outcome) for mid, _, outcome in rows}
    # A command that waited out an outage past its deadline is answered as its handler declares:
    # "expired" with the declared reply, or "dropped" without one (the saga's timer then acts:
    # a compensation is sent again).
    odd = [r for r in rows if r[2] not in ("handled", "expired", "dropped")]
    assert not odd, odd
    answered = {mid for mid, outcome in inbox.items() if outcome != "dropped"}
    events = Reader(world.stack.kafka, [world.prefix + ORDER_EVENTS_TOPIC])
    commands = Reader(world.stack.kafka, [world.prefix + ORDER_COMMANDS_TOPIC])

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
        # ... every command not dropped was answered, and a command answered twice
        # (redelivered after a crash) was answered with the very same reply.
        events.wait_for(lambda _: answered <= set(answers()), what="a reply to every command")
        assert all(len(answers()[mid]) == 1 for mid in answered), "a command got two replies"
        assert not any(answers()[mid] for mid in set(inbox) - answered), "a dropped one answered"
    finally:
        events.close()
        commands.close()

    payments = {
        str(o): bool(r) for o, r in sql(db, f"SELECT order_id, refunded FROM {world.svc}.payment")
    }
    held = {
        str(o): bool(r)
        for o, r in sql(db, f"SELECT order_id, released FROM {world.svc}.reservation")
    }
    shipped = {str(o) for (o,) in sql(db, f"SELECT order_id FROM {world.svc}.shipment")}
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
    wallets = dict(sql(db, f"SELECT owner, balance FROM {world.svc}.wallet"))
    assert sum(wallets.values()) == sum(WALLETS.values())
    assert wallets[MERCHANT] == PRICE * completed
    [(available,)] = sql(db, f"SELECT available FROM {world.svc}.stock")
    assert available + completed == STOCK
