"""The limits the engine is measured against, taken on the same machine in the same run.

- Kafka: consume(num_messages=N) -> produce one record per input -> flush, no database.
- SQL: the engine's own per-batch statements (BatchStore.load and .write, one transaction per
  batch, then the relay's claim-delete), over prebuilt write sets, with no Kafka and no handlers.
- Deadlines: a claim-and-produce loop over due rows with no lease and no sleeping.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from benchmarks.common import kafka_config, say
from processor.engine.records import OffsetCommit, OutboxRow
from processor.engine.rows import (
    DeadlineInsert,
    HistoryRow,
    Outcome,
    SagaStatus,
    SagaWrite,
    Wants,
    WriteSet,
)
from processor.errors import SendFailure
from processor.kafka.producer import make_producer
from processor.messages import (
    HEADER_CAUSATION_ID,
    HEADER_CORRELATION_ID,
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_OCCURRED_AT,
    HEADER_SAGA_ID,
    HEADER_SAGA_TYPE,
    HEADER_SCHEMA_VERSION,
)
from processor.postgres.connect import connect
from processor.postgres.outbox import PostgresOutboxStore
from processor.postgres.schema import Tables
from processor.postgres.store import BatchStore
from processor.runtime.relay import Relay
from processor.wire import DEADLINE_FIRED


@dataclass(frozen=True)
class Measured:
    count: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else float("inf")


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
    # The relay's producer settings, so both sides pay for the same delivery guarantees.
    producer = make_producer(kafka_config(kafka))
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    try:
        parts = consumer.list_topics(source, timeout=10).topics[source].partitions
        consumer.assign([TopicPartition(source, p, OFFSET_BEGINNING) for p in parts])
        seen = 0
        t0 = time.perf_counter()
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
        elapsed = time.perf_counter() - t0
    finally:
        consumer.close()
    if seen < expected or left or errors:
        raise RuntimeError(f"raw Kafka loop: {seen}/{expected} read, {left} unsent, {errors[:1]}")
    return Measured(seen, elapsed)


# -- SQL -----------------------------------------------------------------------------------------


class _NullProducer:
    """Stands in for Kafka so the relay's claim-delete is timed on its own."""

    def send(self, records: Sequence[OutboxRow], timeout: float) -> list[SendFailure]:
        return []

    def close(self, timeout: float) -> None:
        pass


SAGA_TYPE = "transfer-saga"


def _batch(
    ids: list[str], topic: str, partitions: int, first: int, now: datetime
) -> tuple[Wants, WriteSet]:
    """What the planner makes of a batch of TransferRequested events, one new saga each."""
    ws = WriteSet()
    wants = Wants(set(), set(), set())
    for n, saga_id in enumerate(ids, start=first):
        message_id = str(uuid.uuid4())
        wants.saga_keys.add((SAGA_TYPE, saga_id))
        wants.message_keys.add((SAGA_TYPE, saga_id, message_id))
        state = {
            "transfer_id": saga_id,
            "source_account_id": "acc-source",
            "target_account_id": "acc-target",
            "amount": "10.00",
            "debit_confirmed": False,
            "credit_confirmed": False,
        }
        ws.sagas.append(SagaWrite(SAGA_TYPE, saga_id, state, SagaStatus.ACTIVE, 1, None, None))
        partition = n % partitions
        ws.history.append(
            HistoryRow(
                SAGA_TYPE,
                saga_id,
                message_id,
                "transfers.TransferRequested",
                "event",
                Outcome.APPLIED,
                1,
                topic,
                partition,
                n // partitions,
                "on_requested",
            )
        )
        value = {"transfer_id": saga_id, "account_id": "acc-source", "amount": "10.00"}
        headers = {
            HEADER_MESSAGE_ID: str(uuid.uuid4()),
            HEADER_MESSAGE_TYPE: "transfers.DebitAccount",
            HEADER_SCHEMA_VERSION: "1",
            HEADER_CORRELATION_ID: saga_id,
            HEADER_CAUSATION_ID: message_id,
            HEADER_OCCURRED_AT: now.isoformat(),
            HEADER_SAGA_TYPE: SAGA_TYPE,
            HEADER_SAGA_ID: saga_id,
        }
        ws.outbox.append(
            OutboxRow(
                SAGA_TYPE,
                saga_id,
                "account-commands",
                saga_id.encode(),
                headers,
                json.dumps(value).encode(),
            )
        )
        # Scheduling replaces any deadline of that name: the planner emits a delete and an insert.
        ws.deadline_deletes.append((SAGA_TYPE, saga_id, "payment-timeout"))
        ws.deadline_inserts.append(
            DeadlineInsert(
                str(uuid.uuid4()),
                SAGA_TYPE,
                saga_id,
                "payment-timeout",
                now + timedelta(minutes=30),
                None,
                topic,
                partition,
            )
        )
    return wants, ws


def sql_loop(
    database_url: str,
    tables: Tables,
    *,
    events: int,
    batch_size: int,
    partitions: int,
    topic: str,
    progress: Callable[[int], None] = lambda n: None,
) -> Measured:
    """The engine's per-batch SQL for `events` new sagas, plus the relay's claim of their rows."""
    group = "bench-raw-sql"
    store = BatchStore(connect(database_url), tables, group)
    relay = Relay(
        PostgresOutboxStore(lambda: connect(database_url), tables),
        _NullProducer(),
        batch_size=max(1000, batch_size),
    )
    try:
        tps = [(topic, p) for p in range(partitions)]
        epochs = {tp: epoch for tp, (epoch, _) in store.claim(tps, "bench").items()}
        # Built before the clock starts: this is the limit of the SQL, not of making rows.
        now = datetime.now(UTC)
        run = uuid.uuid4().hex[:6]
        batches = []
        positions: dict[tuple[str, int], int | None] = dict.fromkeys(tps)
        for first in range(0, events, batch_size):
            count = min(batch_size, events - first)
            ids = [f"raw-{run}-{i}" for i in range(first, first + count)]
            wants, ws = _batch(ids, topic, partitions, first, now)
            offsets = []
            for tp in tps:
                p = tp[1]
                # Records first..first+count-1 are spread round-robin over the partitions.
                taken = len(range((p - first) % partitions, count, partitions))
                if not taken:
                    continue
                before = positions[tp]
                after = (before or 0) + taken
                offsets.append(OffsetCommit(topic, p, after, before, epochs[tp]))
                positions[tp] = after
            batches.append((wants, ws, offsets))
        done = 0
        t0 = time.perf_counter()
        for wants, ws, offsets in batches:
            with store.conn.transaction():
                store.load(wants)
                store.write(ws, offsets)
            relay.run_once()
            done += len(ws.sagas)
            progress(done)
        while relay.run_once():
            pass
        elapsed = time.perf_counter() - t0
    finally:
        store.conn.close()
        relay.close()
    return Measured(done, elapsed)


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
    producer = make_producer(kafka_config(kafka))
    fired = 0
    with connect(database_url) as conn:
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
