"""Drives the example order saga against real Kafka and PostgreSQL, for the operator tests.

Steps are taken one at a time, each waiting on the database for the saga to get there, so a test
knows exactly which records are in the log and in which order.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from processor._authoring.messages import Message
from processor.settings import ProcessorSettings
from schemas.orders import OrderPlaced
from tests.support.harness import Publisher, create_topics, query, settings_for, wait_until

OPERATOR_KEY = "test-operator-key"
SAGA_TYPE = "order-saga"


@dataclass
class Orders:
    """A processor's settings for the order saga, and a publisher for its events."""

    settings: ProcessorSettings
    pub: Publisher

    @property
    def events(self) -> str:
        return self.settings.topic_prefix + "order-events"

    def db(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        url = self.settings.database.url.get_secret_value()
        return query(url, self.settings.database.schema_name, sql, *args)

    def row(self, order: str) -> tuple[Any, ...] | None:
        rows = self.db(
            "SELECT status, machine_state, version FROM saga_instance WHERE saga_id = %s", order
        )
        return rows[0] if rows else None

    def send(self, message: Message, order: str) -> None:
        self.pub.event(self.events, order, message)
        self.pub.flush()

    def place(self, order: str) -> None:
        placed = OrderPlaced(
            order_id=order, customer_id="c-1", sku="mug", quantity=2, amount=Decimal("12.50")
        )
        self.send(placed, order)
        self.wait_version(order, 1)

    def wait_version(self, order: str, version: int, timeout: float = 60) -> None:
        wait_until(
            lambda: (r := self.row(order)) is not None and r[2] >= version,
            timeout=timeout,
            what=f"{order} at version {version}",
        )

    def wait_status(self, order: str, status: str, timeout: float = 60) -> None:
        wait_until(
            lambda: (r := self.row(order)) is not None and r[0] == status,
            timeout=timeout,
            what=f"{order} {status}",
        )


def make_orders(kafka_bootstrap: str, database_url: str, pg_schema: str) -> Orders:
    """Topics of their own and settings for the order saga (payment timeout 2 s, short retries)."""
    prefix = f"t{uuid.uuid4().hex[:8]}."
    create_topics(
        kafka_bootstrap,
        [
            prefix + t
            for t in ("order-events", "order-commands", "escalations", "saga-dead-letters")
        ],
    )
    settings = settings_for(
        kafka_bootstrap,
        database_url,
        pg_schema,
        prefix,
        sagas=["sagas.order:OrderSaga"],
        # Shipping tries twice, 0.2 s apart, before it asks a person.
        settings={
            "order.payment-timeout": "PT2S",
            "order.ship-retry": {"max_attempts": 2, "base_delay": "PT0.2S", "jitter": 0},
        },
        operator={"key": OPERATOR_KEY, "name": "test-operator"},
    )
    return Orders(settings, Publisher(kafka_bootstrap))
