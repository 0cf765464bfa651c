"""The raw end-to-end limit: the best a user could do by hand without the framework.

One loop: consume a batch (plain confluent-kafka, partitions assigned from the offsets stored in
PostgreSQL), decode each TransferRequested with ``json.loads``, write the sagas, history, outbox,
deadlines and the offsets' compare-and-set in one transaction (:class:`benchmarks.raw_sql.RawStore`,
two round trips), then produce the commands straight from memory and flush. The outbox rows of a
batch are deleted by id inside the next batch's transaction, once their records were
acknowledged: no extra round trip, and a crash re-sends them as the relay would.

``python -m benchmarks.raw_e2e SPEC_JSON`` runs it in a process of its own until SIGTERM (S2).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from benchmarks.boxcpu import Meter, Usage
from benchmarks.common import kafka_config
from benchmarks.raw_limits import produce, raw_producer
from benchmarks.raw_sql import Batch, Measured, RawStore
from processor._postgres.schema.tables import Tables


def e2e_loop(
    kafka: str,
    url: str,
    tables: Tables,
    source: str,
    sink: str,
    *,
    batch_size: int,
    expected: int | None = None,
    stop: threading.Event | None = None,
    group: str = "bench-raw-e2e",
    progress: Callable[[int], None] = lambda n: None,
    meter: Meter | None = None,
) -> Measured:
    """Runs until `expected` events are done (or `stop` is set); returns the time it took."""
    store = RawStore(url, tables, group)
    consumer = Consumer(
        {
            **kafka_config(kafka),
            "group.id": group,
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
        parts = sorted(consumer.list_topics(source, timeout=10).topics[source].partitions)
        positions = store.own(source, parts)
        consumer.assign(
            [
                TopicPartition(source, p, OFFSET_BEGINNING if n is None else n)
                for p, n in positions.items()
            ]
        )
        published: list[int] = []
        done = 0
        t0 = c0 = 0.0
        box0: Usage | None = None
        give_up = time.monotonic() + 600
        while (expected is None or done < expected) and time.monotonic() < give_up:
            if stop is not None and stop.is_set():
                break
            msgs = consumer.consume(num_messages=batch_size, timeout=0.1)
            if not msgs:
                continue
            if not done:
                t0, c0 = time.perf_counter(), time.process_time()
                box0 = meter.read() if meter else None
            batch = Batch()
            moves: dict[int, tuple[int | None, int]] = {}
            now = datetime.now(UTC).isoformat()
            for msg in msgs:
                value, p, offset = msg.value(), msg.partition(), msg.offset()
                if msg.error() is not None or value is None or p is None or offset is None:
                    continue
                headers = dict(msg.headers() or ())
                mid = headers.get("message-id")
                body = json.loads(value)
                batch.add(
                    body["transfer_id"],
                    mid.decode() if isinstance(mid, bytes) else str(mid),
                    body,
                    p,
                    offset,
                    now,
                )
                moves[p] = (moves[p][0] if p in moves else positions[p], offset + 1)
                positions[p] = offset + 1
            ids = store.write(batch, source, moves, forget=published)
            for key, value, hdrs in zip(batch.keys, batch.values, batch.header_lists, strict=True):
                produce(producer, sink, key=key, value=value, headers=hdrs, on_delivery=delivered)
            if producer.flush(30) or errors:
                raise RuntimeError(f"raw end-to-end loop: commands not acknowledged {errors[:1]}")
            published = ids
            done += len(batch)
            progress(done)
        if published:
            store.forget(published)
        elapsed = time.perf_counter() - t0 if done else 0.0
        cpu = time.process_time() - c0 if done else 0.0
        box = meter.read().minus(box0) if meter and box0 else None
    finally:
        consumer.close()
        store.close()
    if expected is not None and done < expected:
        raise RuntimeError(f"raw end-to-end loop: {done}/{expected} events")
    return Measured(done, elapsed, cpu, box=box)


def main(argv: list[str]) -> int:
    """Serves until SIGTERM: the S2 latency counterpart of an engine replica."""
    spec: dict[str, Any] = json.loads(argv[0])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    e2e_loop(
        spec["kafka"],
        spec["url"],
        Tables(schema=spec["schema"]),
        spec["source"],
        spec["sink"],
        batch_size=spec["batch_size"],
        stop=stop,
        group=spec["group"],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
