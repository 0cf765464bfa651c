"""The Kafka limits the engine is measured against, written by hand with plain confluent-kafka.

- Kafka: consume(num_messages=N) -> produce one record per input -> flush, no database.
- Deadlines: a claim-and-produce loop over due rows with no lease and no sleeping, its claims
  growing during a burst as the deadline poller's sweeps do.

The SQL limit is in :mod:`benchmarks.raw_sql`, the end-to-end one in :mod:`benchmarks.raw_e2e`.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from benchmarks.boxcpu import Meter
from benchmarks.common import kafka_config, say
from benchmarks.raw_sql import Measured
from processor._postgres.schema.tables import Tables
from processor._wire import DEADLINE_FIRED

__all__ = ["Drain", "Measured", "deadline_loop", "kafka_loop", "produce", "raw_producer"]


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


def kafka_loop(
    kafka: str,
    source: str,
    sink: str,
    expected: int,
    batch_size: int,
    meter: Meter | None = None,
) -> Measured:
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
        box0 = meter.read() if meter else None
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
        box = meter.read().minus(box0) if meter and box0 else None
    finally:
        consumer.close()
    if seen < expected or left or errors:
        raise RuntimeError(f"raw Kafka loop: {seen}/{expected} read, {left} unsent, {errors[:1]}")
    return Measured(seen, elapsed, cpu, box=box)


# -- deadlines -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drain:
    """One run of :func:`deadline_loop`."""

    fired: int
    # Wall clock (the clock Kafka's CreateTime stamps use) just before the first claim.
    started_at: float
    # Rows each claim returned, in order: shows the batches growing.
    claims: list[int]


def deadline_loop(
    database_url: str,
    tables: Tables,
    kafka: str,
    *,
    expected: int,
    batch_size: int,
    burst_limit: int,
) -> Drain:
    """Claims due rows with a plain DELETE ... RETURNING and produces each, until none are left.

    Claims grow as the deadline poller's sweeps do: the first takes `batch_size` rows, each
    claim that comes back full doubles the next one's limit up to `burst_limit`, and the first
    claim that is not full took every row due, which ends the loop. Each claim commits before
    its records are produced and flushed, as a sweep does.
    """
    claim = tables.render(
        """
        DELETE FROM {deadline} WHERE id IN (
            SELECT id FROM {deadline} WHERE due_at <= now()
             ORDER BY due_at LIMIT %s FOR UPDATE SKIP LOCKED)
        RETURNING id::text, saga_type, saga_id, name, topic, partition, due_at
        """
    )
    producer = raw_producer(kafka)
    claims: list[int] = []
    limit = batch_size
    with psycopg.connect(database_url) as conn:
        # Connected and with the cluster's metadata before the clock starts: the poller it is
        # compared with has been running for a while.
        conn.execute("SELECT 1")
        conn.commit()
        producer.list_topics(timeout=10)
        started_at = time.time()
        while True:
            with conn.transaction():
                rows = conn.execute(claim, (limit,)).fetchall()
            claims.append(len(rows))
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
            if rows and producer.flush(30):
                raise RuntimeError("raw deadline loop: records not acknowledged")
            if len(rows) < limit:
                break
            limit = min(2 * limit, max(burst_limit, batch_size))
    fired = sum(claims)
    if fired < expected:
        say(f"raw deadline loop fired {fired} of {expected} rows")
    return Drain(fired, started_at, claims)
