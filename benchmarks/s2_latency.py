"""S2, latency at load: event produced -> command visible on the command topic, at a steady rate.

Events arrive at a fixed rate (by default half of the engine's S1 throughput in this run) for
`seconds`. One engine replica (a process of its own) turns each into a DebitAccount command; a
reader here, assigned to the command topic's end, takes receipt time minus send time per saga.
The raw end-to-end loop (:mod:`benchmarks.raw_e2e`, also a process of its own) is measured at
the same rate on a topic of its own, right after.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg

from benchmarks import s1_backlog
from benchmarks.common import Scratch, Services, percentile, say
from benchmarks.live import Child, Reader, Source, child_spec, engine_replica
from processor.postgres.schema import Tables
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC

PARTITIONS = s1_backlog.PARTITIONS
GOAL_P99_RATIO = 3.0


@dataclass(frozen=True)
class Options:
    rate: int = 1000
    seconds: int = 60

    @classmethod
    def of(cls, *, quick: bool, rate: int | None) -> Options:
        return cls(rate=rate or 1000, seconds=6 if quick else 60)


def wait_owned(url: str, tables: Tables, group: str, count: int, timeout: float) -> float:
    """Waits until `count` partitions have an owner in the offsets table; returns the wait."""
    t0 = time.monotonic()
    query = tables.render(
        "SELECT count(*) FROM {offsets} WHERE group_id = %s AND owner IS NOT NULL"
    )
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() - t0 < timeout:
            row = conn.execute(query, (group,)).fetchone()
            if row and int(row[0]) >= count:
                return time.monotonic() - t0
            time.sleep(0.1)
    raise RuntimeError(f"{group}: partitions not owned within {timeout:.0f} s")


def _measure(
    found: Services,
    source_topic: str,
    sink: str,
    child: Child,
    ready: Any,
    options: Options,
    run_id: str,
) -> dict[str, Any]:
    try:
        ready()
        source = Source(found.kafka, source_topic, options.rate, run_id)
        reader = Reader(found.kafka, sink, source)
        source.start(options.seconds)
        source.join()
        complete = reader.wait_for(source.count, 30)
        reader.stop()
    finally:
        child.stop()
    lat = sorted(x * 1000 for x in reader.latencies)
    return {
        "events": source.count,
        "commands_seen": len(reader.seen),
        "complete": complete,
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "max_ms": lat[-1] if lat else float("nan"),
    }


def run(found: Services, box: Scratch, options: Options) -> dict[str, Any]:
    say(f"S2 latency at load: {options.rate} events/s for {options.seconds} s, engine then raw")
    source = box.topic(TRANSFER_EVENTS_TOPIC, PARTITIONS)
    commands = box.topic(ACCOUNT_COMMANDS_TOPIC, PARTITIONS)
    box.topic("saga-dead-letters", 1)
    raw_source = box.topic("raw-events", PARTITIONS)
    raw_sink = box.topic("raw-commands", PARTITIONS)

    tables = box.schema("engine")
    settings = s1_backlog.settings(found, tables, box.prefix).model_copy(
        update={"sagas": ["sagas.transfer:TransferSaga"]}
    )
    engine = _measure(
        found,
        source,
        commands,
        engine_replica("s2-engine", settings),
        lambda: wait_owned(found.database_url, tables, settings.consumer.group_id, PARTITIONS, 60),
        options,
        box.run_id + "e",
    )
    say(f"  engine: p50 {engine['p50_ms']:.1f} ms, p99 {engine['p99_ms']:.1f} ms")
    box.settle(tables)

    raw_tables = box.schema("raw")
    group = f"{box.prefix}raw"
    spec = child_spec(
        kafka=found.kafka,
        url=found.database_url,
        schema=raw_tables.schema,
        source=raw_source,
        sink=raw_sink,
        batch_size=s1_backlog.BATCH_SIZE,
        group=group,
    )
    raw = _measure(
        found,
        raw_source,
        raw_sink,
        Child("s2-raw", ["-m", "benchmarks.raw_e2e", spec], {}),
        lambda: wait_owned(found.database_url, raw_tables, group, PARTITIONS, 60),
        options,
        box.run_id + "r",
    )
    say(f"  raw end-to-end: p50 {raw['p50_ms']:.1f} ms, p99 {raw['p99_ms']:.1f} ms")
    ratio = engine["p99_ms"] / raw["p99_ms"] if raw["p99_ms"] > 0 else float("inf")
    return {
        "rate": options.rate,
        "seconds": options.seconds,
        "engine": engine,
        "raw_e2e": raw,
        "p99_ratio": ratio,
        "goal": {"p99_ratio_at_most": GOAL_P99_RATIO, "passed": ratio <= GOAL_P99_RATIO},
    }


def summary(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    e, r, g = result["engine"], result["raw_e2e"], result["goal"]
    at = f"at {result['rate']} events/s, {result['seconds']} s"
    return [
        ("S2", f"engine latency {at}", f"p50 {e['p50_ms']:.1f} ms, p99 {e['p99_ms']:.1f} ms"),
        ("S2", "raw end-to-end latency", f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms"),
        (
            "S2",
            "engine p99 / raw p99",
            f"{result['p99_ratio']:.2f} (goal <= {g['p99_ratio_at_most']}: "
            f"{'PASS' if g['passed'] else 'BELOW'})",
        ),
    ]
