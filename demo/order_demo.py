"""The order saga's part of the demo: participants on the kit, orders, and the final tally.

Orders are placed by customers with enough money (completed), a customer who cannot pay (the
payment is declined and the stock released), a customer the fraud review flags (refunded and
released), a remote customer no carrier serves (shipping fails on every try, the saga escalates
to a person, and the demo's stand-in for that person decides to compensate with ``saga
resolve``: refunded and released), a customer whose bank is slow (the payment times out, the
stock is released, and the capture the bank settles afterwards is refunded, never resumed) and
an unusual customer no analyst reviews (the review times out and escalates; the person rejects
the order with a review decision event: refunded and released). Money only moves between the
customers' wallets and the merchant, so its sum is the same before and after; stock only moves
between the shelf and reservations.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

import psycopg
from confluent_kafka import Producer

from demo.orders import settle_late
from demo.participants import app as participants_app
from demo.participants import seed
from demo.traffic import produce_event
from processor.participant import migrate
from processor.publish import with_client_logging as logged
from processor.settings import ProcessorSettings
from schemas.orders import (
    ESCALATIONS_TOPIC,
    ORDER_COMMANDS_TOPIC,
    ORDER_EVENTS_TOPIC,
    FraudReviewRejected,
    OrderPlaced,
    PaymentCaptured,
)

__all__ = [
    "ORDER_SAGA",
    "ORDER_TOPICS",
    "OrderPlan",
    "order_plan",
    "order_tally",
    "publish_orders",
    "start_order_bank",
    "start_order_participants",
    "start_order_person",
]

ORDER_SAGA = "order-saga"
ORDER_TOPICS = (ORDER_EVENTS_TOPIC, ORDER_COMMANDS_TOPIC, ESCALATIONS_TOPIC)
SKU = "sku-demo"
PRICE = Decimal("20.00")


@dataclass(frozen=True)
class OrderPlan:
    """The orders to place, and the stock and wallets they start from."""

    orders: tuple[OrderPlaced, ...]
    stock: Mapping[str, int]
    wallets: Mapping[str, Decimal]

    def expected(self) -> int:
        return len(self.orders)


def order_plan(stamp: str, n: int) -> OrderPlan:
    """``n`` orders: most paid and shipped; some declined, flagged, or never shippable."""
    orders = []
    for i in range(n):
        customer = {3: "c-poor", 5: "fraud-c", 6: "c-remote", 7: "c-slow", 8: "c-unusual"}.get(
            i % 9, f"c-{i % 3}"
        )
        orders.append(
            OrderPlaced(
                order_id=f"{stamp}-o{i}",
                customer_id=customer,
                sku=SKU,
                quantity=1,
                amount=PRICE,
            )
        )
    wallets = {f"c-{i}": Decimal("1000.00") for i in range(3)}
    wallets.update(
        {
            "c-poor": Decimal("5.00"),
            "fraud-c": Decimal("500.00"),
            "c-remote": Decimal("500.00"),
            "c-slow": Decimal("500.00"),
            "c-unusual": Decimal("500.00"),
        }
    )
    return OrderPlan(tuple(orders), {SKU: n + 5}, wallets)


class Stoppable(Protocol):
    """A started process the demo stops when it ends."""

    def stop(self, timeout: float = ...) -> None: ...


def start_order_participants(
    cleanup: ExitStack,
    env: Mapping[str, str],
    database: str,
    schema: str,
    *,
    plan: OrderPlan,
    spawn: Callable[[dict[str, str]], Stoppable],
) -> Callable[[], tuple[Decimal, int]]:
    """Runs the order participants as `saga-processor participant run demo.participants:app`.

    Their tables are migrated and stocked first, in this process; ``env`` is a replica's
    environment (Kafka, database, topic prefix), ``spawn`` starts the command's process.
    Returns a reader of (money, stock) totals.
    """
    service_env = {
        **env,
        "SAGA_APP": "demo.participants:app",
        "SAGA_INSTANCE_ID": "demo-order-participants",
        "SAGA_PARTICIPANT__SCHEMA_NAME": schema,
        "SAGA_PARTICIPANT__GROUP_ID": f"{env.get('SAGA_TOPIC_PREFIX', '')}order-participants",
    }
    settings = ProcessorSettings(database={"url": database}, participant={"schema_name": schema})
    migrate(settings, participants_app())
    seed(database, schema, plan.stock, plan.wallets)
    proc = spawn(service_env)
    cleanup.callback(proc.stop)

    def totals() -> tuple[Decimal, int]:
        # A connection of its own: the service's serves its consumer thread, one transaction
        # at a time.
        with psycopg.connect(database, options=f"-c search_path={schema}") as conn:
            money = conn.execute("SELECT coalesce(sum(balance), 0) FROM wallet").fetchone()
            held = conn.execute(
                "SELECT (SELECT coalesce(sum(available), 0) FROM stock) + (SELECT "
                "coalesce(sum(quantity), 0) FROM reservation WHERE NOT released)"
            ).fetchone()
        assert money is not None
        assert held is not None
        return Decimal(money[0]), int(held[0])

    return totals


def publish_orders(kafka: str, prefix: str, plan: OrderPlan) -> None:
    """Places every order of the plan."""
    producer = Producer(logged({"bootstrap.servers": kafka, "enable.idempotence": True}))
    for order in plan.orders:
        produce_event(producer, prefix, order, order.order_id, f"placed-{order.order_id}")
    if producer.flush(30):
        raise RuntimeError("orders not acknowledged by the broker")


def start_order_bank(
    cleanup: ExitStack, kafka: str, database: str, schema: str, *, prefix: str
) -> Callable[[], int]:
    """Runs the slow customers' bank: returns a reader of the captures it settled late.

    Once the saga has given up on such an order (its stock released after the payment
    timeout), the bank moves the money after all and the payment service tells the saga, in
    the same transaction, which then refunds it.
    """
    stop = threading.Event()
    settled: list[str] = []
    producer = Producer(logged({"bootstrap.servers": kafka, "enable.idempotence": True}))

    def settle() -> None:
        with psycopg.connect(database, options=f"-c search_path={schema}") as conn:
            while not stop.wait(0.2):
                with conn.transaction():
                    late = settle_late(conn)
                    for order_id in late:
                        event = PaymentCaptured(order_id=order_id)
                        produce_event(producer, prefix, event, order_id, f"late-capture-{order_id}")
                    # Told before the money moves for good: a capture the saga never hears
                    # of would never be refunded.
                    if late and producer.flush(30):
                        raise RuntimeError("late captures not acknowledged by the broker")
                settled.extend(late)

    thread = threading.Thread(target=settle, name="order-bank", daemon=True)
    thread.start()

    def finish() -> None:
        stop.set()
        thread.join(10)
        producer.flush(5)

    cleanup.callback(finish)
    return lambda: len(settled)


def order_tally(database: str, schema: str) -> dict[str, int]:
    """Ended order sagas by final machine state."""
    with psycopg.connect(database) as conn:
        rows = conn.execute(
            f'SELECT machine_state, count(*) FROM "{schema}".saga_instance '
            "WHERE saga_type = %s AND status = 'ended' GROUP BY 1 ORDER BY 1",
            (ORDER_SAGA,),
        ).fetchall()
    return {str(state): int(n) for state, n in rows}


PERSON = "demo-person"
DECISION = "compensate"


def start_order_person(
    cleanup: ExitStack, kafka: str, database: str, schema: str, *, prefix: str, key: str
) -> Callable[[], dict[str, int]]:
    """Stands in for the person the order saga escalates to; returns a reader of the decisions
    taken, by step.

    Reads the escalations topic. For a step whose retries ran out (shipping) it decides to
    compensate, with ``saga resolve`` (an operator record signed with the processor's operator
    key); for a fraud review nobody did in time it rejects the order, with the review's own
    decision event, as an analyst's tool would.
    """
    from confluent_kafka import Consumer

    from processor.ops import Adapters, OperatorAction, send_operator_request
    from schemas.orders import EscalateToPerson

    stop = threading.Event()
    decided: Counter[str] = Counter()
    events = Producer(logged({"bootstrap.servers": kafka, "enable.idempotence": True}))
    consumer = Consumer(
        logged(
            {
                "bootstrap.servers": kafka,
                "group.id": f"{prefix}person",
                "auto.offset.reset": "earliest",
            }
        )
    )
    consumer.subscribe([prefix + ESCALATIONS_TOPIC])
    adapters = Adapters(
        ProcessorSettings(
            kafka={"bootstrap_servers": kafka},
            database={"url": database, "schema_name": schema},
        )
    )
    # The operator record goes to an explicit partition; the partitioner is the default.
    producer = adapters.record_producer()

    def decide() -> None:
        with adapters.inspect_queries() as queries:
            while not stop.is_set():
                msg = consumer.poll(0.2)
                if msg is None or msg.error() is not None:
                    continue
                told = EscalateToPerson.model_validate_json(msg.value() or b"")
                if told.reason == "approval-timeout":
                    rejected = FraudReviewRejected(
                        order_id=told.order_id, reason=f"{PERSON}: nobody could review it in time"
                    )
                    produce_event(
                        events, prefix, rejected, told.order_id, f"review-{told.order_id}"
                    )
                    if events.flush(30):
                        raise RuntimeError("review decision not acknowledged by the broker")
                    decided[str(told.step)] += 1
                    continue
                if told.reason != "retries-exhausted":
                    continue
                send_operator_request(
                    queries,
                    producer,
                    key.encode(),
                    action=OperatorAction.RESOLVE,
                    saga_type=ORDER_SAGA,
                    saga_id=told.order_id,
                    by=PERSON,
                    reason=f"{told.detail}: refund the customer",
                    name=DECISION,
                )
                decided[str(told.step)] += 1

    thread = threading.Thread(target=decide, name="order-person", daemon=True)
    thread.start()

    def finish() -> None:
        stop.set()
        thread.join(10)
        consumer.close()
        producer.close(5.0)
        events.flush(5)

    cleanup.callback(finish)
    return lambda: dict(decided)
