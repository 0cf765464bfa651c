"""Signed operator records replayed on real Kafka and PostgreSQL: each decides once, then expires.

Someone who may write to a saga's input topic but holds no operator key can still copy a signed
record and produce it again. A cancel that met no saga (sent before the transfer started) is a
duplicate when its very bytes come again after the transfer started: the transfer runs on. A
correctly signed cancel issued before the expiry is refused as expired, and one sent with another
key, or to another partition than its saga's, is dead-lettered.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from processor._engine.partitioner import partition_for
from processor._wire import OperatorAction, OperatorRecord
from processor.settings import ProcessorSettings
from sagas.transfer import TransferSaga
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC, TransferRequested
from tests.support.harness import (
    Publisher,
    create_topics,
    query,
    running,
    settings_for,
    wait_until,
)

pytestmark = [pytest.mark.integration]

OPERATOR_KEY = "replay-operator-key"
SAGA_TYPE = "transfer-saga"
PARTITIONS = 4


@dataclass
class Stack:
    """This test's topics, settings and producer."""

    settings: ProcessorSettings
    events: str
    pub: Publisher
    database_url: str
    schema: str

    def db(self, sql_text: str, *args: Any) -> list[tuple[Any, ...]]:
        return query(self.database_url, self.schema, sql_text, *args)

    def request(self, transfer: str, command_id: str, issued_at: int) -> OperatorRecord:
        return OperatorRecord(
            OperatorAction.CANCEL,
            SAGA_TYPE,
            transfer,
            command_id,
            "ops",
            "customer called",
            issued_at=issued_at,
        )

    def produce(
        self, request: OperatorRecord, key: bytes, partition: int | None = None
    ) -> tuple[bytes, list[tuple[str, bytes]]]:
        """Sends ``request`` signed with the processor's key; returns the value and headers sent."""
        value = request.value()
        headers = [(k, v.encode()) for k, v in request.headers(OPERATOR_KEY.encode()).items()]
        self.send(key, value, headers, partition)
        return value, headers

    def send(
        self,
        key: bytes,
        value: bytes,
        headers: list[tuple[str, bytes]],
        partition: int | None = None,
    ) -> None:
        """Produces these bytes as they are: where the key hashes to, or to ``partition``."""
        if partition is None:
            self.pub.raw(self.events, key, value, headers)
        else:
            placed: list[tuple[str, str | bytes | None]] = [*headers]
            self.pub.producer.produce(
                self.events, key=key, value=value, headers=placed, partition=partition
            )
        self.pub.flush()

    def start(self, transfer: str) -> None:
        self.pub.event(
            self.events,
            transfer,
            TransferRequested(
                transfer_id=transfer,
                source_account_id="A",
                target_account_id="B",
                amount=Decimal("10.00"),
            ),
        )
        self.pub.flush()

    def outcomes(self, message_id: str) -> list[tuple[str, str | None]]:
        return [
            (o, d)
            for o, d in self.db(
                "SELECT outcome, detail FROM saga_history WHERE message_id = %s ORDER BY id",
                message_id,
            )
        ]

    def status(self, transfer: str) -> str | None:
        rows = self.db("SELECT status FROM saga_instance WHERE saga_id = %s", transfer)
        return rows[0][0] if rows else None


@pytest.fixture
def stack(kafka_bootstrap: str, database_url: str, pg_schema: str) -> Stack:
    prefix = f"r{uuid.uuid4().hex[:8]}."
    events = prefix + TRANSFER_EVENTS_TOPIC
    create_topics(kafka_bootstrap, [events], partitions=PARTITIONS)
    create_topics(kafka_bootstrap, [prefix + ACCOUNT_COMMANDS_TOPIC, prefix + "saga-dead-letters"])
    settings = settings_for(
        kafka_bootstrap,
        database_url,
        pg_schema,
        prefix,
        operator={"key": OPERATOR_KEY, "name": "replay-test", "expiry": "5m"},
    )
    return Stack(settings, events, Publisher(kafka_bootstrap), database_url, pg_schema)


def _now_ms() -> int:
    return int(time.time() * 1000)


def test_the_bytes_of_a_cancel_that_met_no_saga_do_not_cancel_it_once_it_started(
    stack: Stack,
) -> None:
    transfer = f"tr-{uuid.uuid4().hex[:8]}"
    request = stack.request(transfer, uuid.uuid4().hex, _now_ms())
    with running(stack.settings, [TransferSaga]):
        value, headers = stack.produce(request, transfer.encode())
        wait_until(lambda: stack.outcomes(request.message_id), what="the cancel decided")
        assert [o for o, _ in stack.outcomes(request.message_id)] == ["no-saga"]

        stack.start(transfer)
        wait_until(lambda: stack.status(transfer) == "active", what="the transfer started")
        # The same record again, byte for byte: same headers, same value, same signature.
        stack.send(transfer.encode(), value, headers)
        wait_until(
            lambda: len(stack.outcomes(request.message_id)) == 2,
            what="the copy recorded",
        )
        assert [o for o, _ in stack.outcomes(request.message_id)] == ["no-saga", "duplicate"]
        # Recorded in the batch that would have cancelled it: the transfer runs on, untouched.
        assert stack.db(
            "SELECT status, version FROM saga_instance WHERE saga_id = %s", transfer
        ) == [("active", 1)]
    assert stack.db("SELECT action, outcome, actor FROM operator_audit") == [
        ("cancel", "no-saga", "ops")
    ]


def test_an_expired_cancel_is_refused_and_a_misplaced_one_dead_lettered(stack: Stack) -> None:
    transfer = f"tr-{uuid.uuid4().hex[:8]}"
    home = partition_for(transfer.encode(), PARTITIONS, "crc32")
    with running(stack.settings, [TransferSaga]):
        stack.start(transfer)
        wait_until(lambda: stack.status(transfer) == "active", what="the transfer started")

        # Signed with the right key, issued ten minutes ago: past the five-minute expiry.
        expired = stack.request(transfer, "expired", _now_ms() - 10 * 60 * 1000)
        stack.produce(expired, transfer.encode())
        # Signed and fresh, but keyed by another saga's id (on the saga's own partition), or
        # keyed right on another partition.
        keyed = stack.request(transfer, "keyed", _now_ms())
        stack.produce(keyed, b"some-other-transfer", partition=home)
        elsewhere = stack.request(transfer, "elsewhere", _now_ms())
        stack.produce(elsewhere, transfer.encode(), partition=(home + 1) % PARTITIONS)

        wait_until(lambda: stack.outcomes(expired.message_id), what="the expired cancel decided")
        [(outcome, detail)] = stack.outcomes(expired.message_id)
        assert outcome == "operator-refused"
        assert detail is not None
        assert "(expired: issued 10m" in detail
        assert "the expiry is 5m00s" in detail

        def dead_letters() -> list[tuple[Any, ...]]:
            rows = stack.db("SELECT reason, detail FROM dead_letter ORDER BY id")
            return rows if len(rows) == 2 else []

        letters = wait_until(dead_letters, what="both misplaced cancels dead-lettered")
        assert sorted(letters) == [
            (
                "misplaced",
                f"partition {(home + 1) % PARTITIONS} is not its saga's: "
                f"SAGA_CONSUMER__PARTITIONER=crc32 puts the saga id on partition {home} "
                f"of {PARTITIONS}",
            ),
            ("misplaced", "the record's key is not its saga id"),
        ]
        assert stack.status(transfer) == "active"
        assert stack.outcomes(keyed.message_id) == []
        assert stack.outcomes(elsewhere.message_id) == []
    assert stack.db("SELECT action, outcome, actor FROM operator_audit") == [
        ("cancel", "operator-refused", "ops")
    ]
