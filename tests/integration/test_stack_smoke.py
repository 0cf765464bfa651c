"""The services under the tests are real: Kafka keeps what it acked; Postgres is transactional."""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from psycopg import sql

from devstack import Services, wait_for_kafka

pytestmark = pytest.mark.integration


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    for value in values:
        producer.produce(topic, value=value, key=b"k", on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert errors == []


def _consume(consumer: Consumer, count: int, timeout: float = 30.0) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for msg in consumer.consume(num_messages=count - len(got), timeout=0.5):
            assert msg.error() is None, msg.error()
            got.append(msg)
    return got


def _group_consumer(bootstrap: str, group: str, topic: str) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    return consumer


def test_idempotent_producer_and_group_consumer_with_manual_offsets(
    kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    topic = make_topic()
    group = f"{topic}.group"
    _produce(kafka_bootstrap, topic, [b"a", b"b", b"c"])

    first = _group_consumer(kafka_bootstrap, group, topic)
    got = _consume(first, 3)
    assert [m.value() for m in got] == [b"a", b"b", b"c"]
    # Commit only the first two: the group must resume at the third.
    second_offset = got[1].offset()
    assert second_offset is not None
    first.commit(offsets=[TopicPartition(topic, 0, second_offset + 1)], asynchronous=False)
    first.close()

    _produce(kafka_bootstrap, topic, [b"d"])
    second = _group_consumer(kafka_bootstrap, group, topic)
    try:
        assert [m.value() for m in _consume(second, 2)] == [b"c", b"d"]
    finally:
        second.close()


def test_postgres_commit_is_kept_and_rollback_is_not(database_url: str, pg_schema: str) -> None:
    table = sql.Identifier(pg_schema, "probe")
    with psycopg.connect(database_url) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (v int)").format(table))
        conn.commit()
        with conn.transaction():
            conn.execute(sql.SQL("INSERT INTO {} VALUES (1)").format(table))
        with conn.transaction() as tx:
            conn.execute(sql.SQL("INSERT INTO {} VALUES (2)").format(table))
            raise psycopg.Rollback(tx)
    with psycopg.connect(database_url) as other:
        rows = other.execute(sql.SQL("SELECT v FROM {}").format(table)).fetchall()
    assert rows == [(1,)]


@pytest.mark.slow
@pytest.mark.serial
def test_broker_restart_keeps_acknowledged_messages(
    services: Services, make_topic: Callable[..., str]
) -> None:
    if services.restart_kafka is None:
        pytest.skip(
            "the broker was not started by this run (SAGA_TEST_ALLOW_BROKER_RESTART=1 allows it)"
        )
    topic = make_topic()
    _produce(services.kafka_bootstrap, topic, [b"before-restart-1", b"before-restart-2"])

    services.restart_kafka()
    wait_for_kafka(services.kafka_bootstrap)

    consumer = _group_consumer(services.kafka_bootstrap, f"{topic}.group", topic)
    try:
        values = [m.value() for m in _consume(consumer, 2, timeout=60)]
    finally:
        consumer.close()
    assert values == [b"before-restart-1", b"before-restart-2"]
