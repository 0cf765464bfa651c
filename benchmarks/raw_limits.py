"""The Kafka limits the engine is measured against, written by hand with plain confluent-kafka.

- Kafka: consume(num_messages=N) -> produce one record per input -> flush, no database.
- Deadlines: a claim-and-produce loop over due rows with no lease and no sleeping.

The SQL limit is in :mod:`benchmarks.raw_sql`, the end-to-end one in :mod:`benchmarks.raw_e2e`.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from benchmarks.common import kafka_config, say
from benchmarks.raw_sql import Measured
from processor.postgres.schema import Tables
from processor.wire import DEADLINE_FIRED

__all__ = ["Measured", "deadline_loop", "kafka_loop", "produce", "raw_producer"]


def raw_producer(kafka: str) -> Producer:
    """The relay's delivery guarantees, spelled out here rather than taken from the engine."""
    return Producer(
        {
            **kafka_config(kafka),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 30000,
            "enable.gapless.guarantee": True,
            "delivery.report.only.error": True,
        }
    )


def produce(producer: Producer, topic: str, **kwargs: Any) -> None:
    while True:
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)


# -- Kafka ---------------------------------------------------------------------------------------


def kafka_loop(kafka: str, source: str, sink: str, expected: int, batch_size: int) -> Measured:
    """Reads `expected` records from `source` and writes each to `sink`; no database at all."""
    consumer = Consumer(
        {
            **kafka_config(kafka),
            "group.id": f"bench-raw-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    producer = raw_producer(kafka)
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    try:
        parts = consumer.list_topics(source, timeout=10).topics[source].partitions
        consumer.assign([TopicPartition(source, p, OFFSET_BEGINNING) for p in parts])
        seen = 0
        t0, c0 = time.perf_counter(), time.process_time()
        give_up = t0 + 300
        while seen < expected and time.perf_counter() < give_up:
            for msg in consumer.consume(num_messages=batch_size, timeout=0.5):
                if msg.error() is not None:
                    continue
                produce(
                    producer,
                    sink,
                    key=msg.key(),
                    value=msg.value(),
                    headers=msg.headers(),
                    on_delivery=delivered,
                )
                seen += 1
            producer.poll(0)
        left = producer.flush(60)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        consumer.close()
    if seen < expected or left or errors:
        raise RuntimeError(f"raw Kafka loop: {seen}/{expected} read, {left} unsent, {errors[:1]}")
    return Measured(seen, elapsed, cpu)


# -- deadlines -----------------------------------------------------------------------------------


def deadline_loop(
    database_url: str, tables: Tables, kafka: str, *, expected: int, batch_size: int
) -> Measured:
    """Claims due rows with a plain DELETE ... RETURNING and produces each, until none are left."""
    claim = tables.render(
        """
        DELETE FROM {deadline} WHERE id IN (
            SELECT id FROM {deadline} WHERE due_at <= now()
             ORDER BY due_at LIMIT %s FOR UPDATE SKIP LOCKED)
        RETURNING id::text, saga_type, saga_id, name, topic, partition, due_at
        """
    )
    producer = raw_producer(kafka)
    fired = 0
    with psycopg.connect(database_url) as conn:
        t0 = time.perf_counter()
        while True:
            with conn.transaction():
                rows = conn.execute(claim, (batch_size,)).fetchall()
            if not rows:
                break
            for did, saga_type, saga_id, name, topic, partition, due_at in rows:
                value = {
                    "saga_type": saga_type,
                    "saga_id": saga_id,
                    "deadline_id": did,
                    "name": name,
                    "token": 0,
                    "due_at": due_at.isoformat(),
                }
                produce(
                    producer,
                    topic,
                    key=saga_id.encode(),
                    value=json.dumps(value).encode(),
                    partition=partition,
                    headers=[("message-type", DEADLINE_FIRED.encode())],
                )
            if producer.flush(30):
                raise RuntimeError("raw deadline loop: records not acknowledged")
            fired += len(rows)
        elapsed = time.perf_counter() - t0
    if fired < expected:
        say(f"raw deadline loop fired {fired} of {expected} rows")
    return Measured(fired, elapsed)
