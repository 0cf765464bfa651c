"""Online growth against real services: librdkafka's partitioners, routing, metadata, shutdown.

The growth tables' own rules are in tests/contract/test_growth_contract.py.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from decimal import Decimal

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]

from processor._engine.partitioner import Partitioner, partition_for
from processor._kafka.metadata import KafkaTopicMetadata
from processor._postgres.connect import connect, ensure_schema
from processor._postgres.growth import PostgresGrowthStore, current_router
from processor._postgres.schema.tables import Tables
from schemas.transfers import (
    ACCOUNT_COMMANDS_TOPIC,
    TRANSFER_EVENTS_TOPIC,
    DebitConfirmed,
    TransferRequested,
)
from tests.support.harness import (
    create_topics,
    headers_for,
    query,
    running,
    settings_for,
    wait_until,
)

DEAD_LETTERS = "saga-dead-letters"

pytestmark = pytest.mark.integration

KEYS = [f"saga-{i}".encode() for i in range(300)] + [b"x", b"ab", b"abc", "ünï".encode()]


@pytest.mark.parametrize(
    ("client_partitioner", "ours"), [("murmur2_random", "murmur2"), ("consistent_random", "crc32")]
)
def test_our_partitioner_agrees_with_the_client_on_a_real_topic(
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    client_partitioner: str,
    ours: Partitioner,
) -> None:
    topic = make_topic("keys", partitions=12)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": client_partitioner})
    landed: dict[bytes, int] = {}

    def delivered(err: object, msg: object) -> None:
        assert err is None, err
        landed[msg.key()] = msg.partition()  # type: ignore[attr-defined]

    for key in KEYS:
        producer.produce(topic, key=key, value=b"v", on_delivery=delivered)
    assert producer.flush(30) == 0
    assert landed == {k: partition_for(k, 12, ours) for k in KEYS}


@pytest.fixture
def tables(database_url: str, pg_schema: str) -> Tables:
    t = Tables(schema=pg_schema)
    ensure_schema(database_url, t)
    return t


def _store(database_url: str, tables: Tables) -> PostgresGrowthStore:
    return PostgresGrowthStore(lambda: connect(database_url), tables)


def test_operator_records_follow_a_moved_saga_to_its_new_partition(
    database_url: str, tables: Tables
) -> None:
    moved = next(k for k in KEYS if partition_for(k, 12, "murmur2") >= 6)
    stays = next(k for k in KEYS if partition_for(k, 12, "murmur2") < 6)
    old = partition_for(moved, 6, "murmur2")
    store = _store(database_url, tables)
    try:
        store.baseline("g", "in", 6)
        route = current_router(lambda: connect(database_url), tables, "g", "murmur2")
        # No growth yet: a saga's latest event's partition is where its records go.
        assert route("in", moved, old) == old
        assert store.grow("g", "in", 6, 12)
    finally:
        store.close()
    route = current_router(lambda: connect(database_url), tables, "g", "murmur2")
    assert route("in", moved, old) == partition_for(moved, 12, "murmur2")
    assert route("in", stays, partition_for(stays, 6, "murmur2")) == partition_for(
        stays, 12, "murmur2"
    )
    # Another group, or a topic with no recorded count: the stored partition stands.
    assert (
        current_router(lambda: connect(database_url), tables, "h", "murmur2")("in", moved, old)
        == old
    )
    assert route("other", moved, old) == old


def test_metadata_sees_new_partitions_and_their_watermarks(
    kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    topic = make_topic("grows", partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for _ in range(3):
        producer.produce(topic, key=b"k", value=b"v", partition=1)
    assert producer.flush(30) == 0
    meta = KafkaTopicMetadata({"bootstrap.servers": kafka_bootstrap}, "growth-test")
    try:
        assert meta.partition_counts([topic, "no-such-topic-here"]) == {topic: 2}
        assert meta.high_watermarks(topic, [0, 1]) == {0: 0, 1: 3}
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        for future in admin.create_partitions([NewPartitions(topic, 4)]).values():
            future.result()
        # The brokers' metadata follows within moments.
        wait_until(lambda: meta.partition_counts([topic]) == {topic: 4}, 30, "4 partitions")
    finally:
        meta.close()


def test_a_processor_stops_without_sleeping_out_its_growth_checks_and_relay_polls(
    kafka_bootstrap: str, database_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    create_topics(
        kafka_bootstrap,
        [prefix + TRANSFER_EVENTS_TOPIC, prefix + ACCOUNT_COMMANDS_TOPIC, prefix + DEAD_LETTERS],
        partitions=2,
    )
    # Both loops would sleep far longer than the shutdown budget.
    settings = settings_for(
        kafka_bootstrap,
        database_url,
        pg_schema,
        prefix,
        consumer={"growth_check_interval": "300s"},
        relay={"poll_interval": "300s"},
        shutdown_timeout="20s",
    )
    caplog.set_level(logging.WARNING, logger="processor._runtime.processor")
    with running(settings) as proc:
        worker = proc.worker
        assert worker is not None
        wait_until(lambda: len(worker.epochs) == 2, 30, "both partitions claimed")
        stopping = time.monotonic()
    # running() joined the processor's thread: every loop ended within the budget.
    assert not [r for r in caplog.records if "still running" in r.getMessage()]
    assert time.monotonic() - stopping < 20


def test_a_new_partition_follows_an_old_one_that_ends_in_a_transaction_marker(
    kafka_bootstrap: str, database_url: str, pg_schema: str
) -> None:
    """A transactional producer leaves a commit marker after its last record: no record's
    offset reaches the old partition's high watermark, yet the new partition must go on."""
    prefix = f"t{uuid.uuid4().hex[:8]}."
    events = prefix + TRANSFER_EVENTS_TOPIC
    create_topics(kafka_bootstrap, [events, prefix + ACCOUNT_COMMANDS_TOPIC], partitions=2)
    create_topics(kafka_bootstrap, [prefix + DEAD_LETTERS])
    saga = next(
        k.decode()
        for k in KEYS
        if partition_for(k, 4, "crc32") >= 2 and k.decode().startswith("saga-")
    )
    old, new = partition_for(saga.encode(), 2, "crc32"), partition_for(saga.encode(), 4, "crc32")
    settings = settings_for(
        kafka_bootstrap,
        database_url,
        pg_schema,
        prefix,
        consumer={"growth_check_interval": "300ms"},
    )

    def applied() -> list[tuple[str, int]]:
        return [
            (str(k), int(p))
            for k, p in query(
                database_url,
                pg_schema,
                "SELECT kind, partition FROM saga_history WHERE saga_id = %s AND outcome = "
                "'applied' ORDER BY id",
                saga,
            )
        ]

    def offsets() -> dict[int, int]:
        rows = query(
            database_url,
            pg_schema,
            "SELECT partition, next_offset FROM consumer_offset WHERE topic = %s",
            events,
        )
        return {int(p): int(n) for p, n in rows if n is not None}

    with running(settings) as proc:
        worker = proc.worker
        assert worker is not None
        wait_until(lambda: len(worker.epochs) == 2, 30, "both partitions claimed")
        # A stale, transactional upstream producer: its start event, then the commit marker.
        txn = Producer(
            {"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{prefix}upstream"}
        )
        txn.init_transactions(30)
        txn.begin_transaction()
        start = TransferRequested(
            transfer_id=saga, source_account_id="A", target_account_id="B", amount=Decimal("1")
        )
        txn.produce(
            events,
            key=saga.encode(),
            value=start.model_dump_json().encode(),
            headers=[*headers_for(start)],
            partition=old,
        )
        txn.commit_transaction(30)
        meta = KafkaTopicMetadata({"bootstrap.servers": kafka_bootstrap}, "marker-test")
        try:
            # The record and its marker; the coordinator writes the marker after the commit
            # returns, and until then the end a read-committed client sees stays before it.
            mark = wait_until(
                lambda: meta.high_watermarks(events, [old])[old] == 2 and 2, 30, "the marker"
            )
        finally:
            meta.close()
        # Stored past the marker once the partition is read to its end, not at 1.
        wait_until(lambda: offsets().get(old) == mark, 30, "the old partition stored at its end")
        assert applied() == [("event", old)]

        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        for future in admin.create_partitions([NewPartitions(events, 4)]).values():
            future.result(30)
        wait_until(lambda: len(worker.epochs) == 4 or None, 60, "the new partitions claimed")
        debit = DebitConfirmed(transfer_id=saga, account_id="A", amount=Decimal("1"))
        plain = Producer({"bootstrap.servers": kafka_bootstrap})
        plain.produce(
            events,
            key=saga.encode(),
            value=debit.model_dump_json().encode(),
            headers=[*headers_for(debit)],
            partition=new,
        )
        assert plain.flush(30) == 0
        wait_until(lambda: len(applied()) == 2, 30, "the reply on the new partition applied")
        assert applied() == [("event", old), ("event", new)]
