"""S3, relay drain: how fast the engine's relay publishes a preloaded outbox, against a raw loop.

N command rows wait in the outbox, spread over the input partitions that caused them. The
engine's relay (:class:`processor._runtime.relay.Relay` over the PostgreSQL outbox store, owning
every partition at its epoch, as a single replica would) drains them round after round. The raw
limit, written here by hand with psycopg and confluent-kafka, does the least a correct relay
must: claim a batch with ``DELETE ... RETURNING`` in id order, produce each row, flush, commit.
Both run on fresh copies of the same rows, alternating round by round; reported are events/s
and the engine's ratio to the raw loop.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import KafkaException

from benchmarks.common import Scratch, Services, end_offsets, kafka_config, say
from benchmarks.raw_limits import produce, raw_producer
from benchmarks.raw_sql import Measured
from processor._kafka.producer import KafkaRecordProducer, make_producer, relay_overrides
from processor._postgres.batch.store import BatchSql
from processor._postgres.connect import connect
from processor._postgres.outbox import PostgresOutboxStore
from processor._postgres.schema.tables import Tables
from processor._runtime.relay import Relay

DEFAULT_ROWS = 100_000
QUICK_ROWS = 20_000
PARTITIONS = 6
# The relay's default round size (RelaySettings.batch_size); the raw loop claims as many.
BATCH_SIZE = 1000
GROUP = "s3"
SOURCE = "transfer-events"


@dataclass(frozen=True)
class Options:
    rows: int
    rounds: int

    @classmethod
    def of(cls, *, quick: bool, rows: int | None = None) -> Options:
        return cls(rows or (QUICK_ROWS if quick else DEFAULT_ROWS), 1 if quick else 3)


def preload(url: str, tables: Tables, topic: str, rows: int) -> dict[tuple[str, int], int]:
    """Commands as the worker writes them (about 600 bytes of headers and value each), and the
    owner epochs of their source partitions; returns the epochs."""
    insert = tables.render(
        """
        INSERT INTO {outbox} (saga_type, saga_id, topic, partition, key, headers, value,
                              source_topic, source_partition)
        SELECT 'transfer', 'tr-' || i, %(topic)s, NULL, convert_to('tr-' || i, 'UTF8'),
               jsonb_build_object(
                   'message-id', md5(i::text), 'message-type', 'transfers.DebitAccount',
                   'schema-version', '1', 'correlation-id', 'tr-' || i,
                   'causation-id', md5((-i)::text), 'occurred-at', now()::text,
                   'saga-type', 'transfer', 'saga-id', 'tr-' || i),
               convert_to(repeat('x', 200), 'UTF8'), %(source)s, i %% %(partitions)s
          FROM generate_series(1, %(rows)s) AS i
        """
    )
    with connect(url, autocommit=True) as conn:
        conn.execute(
            insert, {"topic": topic, "source": SOURCE, "partitions": PARTITIONS, "rows": rows}
        )
        conn.execute(tables.render("VACUUM ANALYZE {outbox}"))
    with connect(url) as conn:
        claimed = BatchSql(conn, tables, GROUP).claim(
            [(SOURCE, p) for p in range(PARTITIONS)], "s3"
        )
    return {tp: epoch for tp, (epoch, _) in claimed.items()}


def engine_drain(found: Services, tables: Tables, epochs: dict[tuple[str, int], int]) -> Measured:
    relay = Relay(
        PostgresOutboxStore(lambda: connect(found.database_url), tables, f"{GROUP}"),
        KafkaRecordProducer(
            lambda: make_producer(
                kafka_config(found.kafka), partitioner="crc32", **relay_overrides(1_000_000)
            )
        ),
        batch_size=BATCH_SIZE,
        owned=lambda: epochs,
    )
    try:
        # The first round connects and starts the producer (the raw loop does so untimed too).
        warm = relay.run_once()
        t0, c0 = time.perf_counter(), time.process_time()
        while relay.run_once():
            pass
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        relay.close()
    return Measured(relay.published - warm, seconds, cpu)


def raw_drain(found: Services, tables: Tables, rows: int) -> Measured:
    """Claim (DELETE ... RETURNING in id order), produce, flush, commit; until empty."""
    claim = tables.render(
        """
        DELETE FROM {outbox} WHERE id IN
            (SELECT id FROM {outbox} ORDER BY id LIMIT %s FOR UPDATE)
        RETURNING id, topic, key, headers, value
        """
    )
    producer = raw_producer(found.kafka)
    sent = 0
    with psycopg.connect(found.database_url) as conn:
        conn.execute("SELECT 1")
        conn.commit()
        producer.list_topics(timeout=10)
        t0, c0 = time.perf_counter(), time.process_time()
        while True:
            with conn.transaction():
                batch = conn.execute(claim, (BATCH_SIZE,)).fetchall()
                if not batch:
                    break
                batch.sort(key=lambda r: r[0])
                for _id, topic, key, headers, value in batch:
                    produce(producer, topic, key=key, value=value, headers=list(headers.items()))
                if producer.flush(60):
                    raise RuntimeError("raw relay: flush left records unsent")
            sent += len(batch)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    if sent != rows:  # the engine's side is checked by the commands delivered
        raise RuntimeError(f"raw relay published {sent} of {rows}")
    return Measured(sent, seconds, cpu)


def records(kafka: str, topic: str) -> int:
    """Records on ``topic``; a topic just made may have no partition leader for a moment."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return sum(end_offsets(kafka, topic).values())
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _side(m: Measured) -> dict[str, float]:
    return {"events": m.count, "seconds": m.seconds, "events_per_s": m.rate, "cpu_us": m.cpu_us}


def run(found: Services, box: Scratch, options: Options) -> dict[str, Any]:
    n = options.rows
    say(
        f"S3 relay drain: {n} outbox rows over {PARTITIONS} source partitions, rounds of "
        f"{BATCH_SIZE}; engine relay against a raw claim-produce-flush-commit loop, "
        f"{options.rounds} alternating rounds"
    )
    commands = box.topic("account-commands", PARTITIONS)
    rounds: list[dict[str, Any]] = []
    for r in range(1, options.rounds + 1):
        before = records(found.kafka, commands)
        raw_tables = box.schema(f"raw{r}")
        preload(found.database_url, raw_tables, commands, n)
        raw = raw_drain(found, raw_tables, n)
        engine_tables = box.schema(f"engine{r}")
        epochs = preload(found.database_url, engine_tables, commands, n)
        engine = engine_drain(found, engine_tables, epochs)
        delivered = records(found.kafka, commands) - before
        ratio = engine.rate / raw.rate
        say(
            f"round {r}: raw {raw.rate:,.0f} events/s ({raw.cpu_us:.0f} us CPU/event), engine "
            f"{engine.rate:,.0f} events/s ({engine.cpu_us:.0f} us CPU/event): ratio {ratio:.2f}"
        )
        rounds.append(
            {"raw": _side(raw), "engine": _side(engine), "ratio": ratio, "delivered": delivered}
        )
    ratio = float(statistics.median(x["ratio"] for x in rounds))
    return {
        "rows": n,
        "partitions": PARTITIONS,
        "batch_size": BATCH_SIZE,
        "rounds": rounds,
        "median": {
            side: {
                "events_per_s": float(statistics.median(x[side]["events_per_s"] for x in rounds)),
                "cpu_us": float(statistics.median(x[side]["cpu_us"] for x in rounds)),
            }
            for side in ("raw", "engine")
        },
        "ratio": ratio,
        "commands_complete": all(x["delivered"] == 2 * n for x in rounds),
    }


def summary(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    m = result["median"]
    rows = [
        (
            "S3",
            "raw relay loop",
            f"{m['raw']['events_per_s']:,.0f} events/s, {m['raw']['cpu_us']:.0f} us CPU/event",
        ),
        (
            "S3",
            "engine relay",
            f"{m['engine']['events_per_s']:,.0f} events/s, "
            f"{m['engine']['cpu_us']:.0f} us CPU/event",
        ),
        ("S3", "engine relay / raw loop", f"{result['ratio']:.2f}"),
    ]
    if not result["commands_complete"]:
        rows.append(("S3", "commands delivered", "INCOMPLETE: see the JSON report"))
    return rows
