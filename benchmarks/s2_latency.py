"""S2, latency at load: event produced -> command visible on the command topic, at a steady rate.

Events arrive at a fixed rate (by default half of the engine's S1 throughput in this run) for
`seconds`. One engine replica (a process of its own) turns each into a DebitAccount command; a
reader here, assigned to the command topic's end, takes receipt time minus send time per saga.
The raw end-to-end loop (:mod:`benchmarks.raw_e2e`, also a process of its own) is measured at
the same rate on topics of its own. Rounds alternate which side goes first, each side on fresh
topics and tables and a settled database; the goal reads the median of the rounds' ratios.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from benchmarks import s1_backlog
from benchmarks.common import Scratch, Services, alternating, percentile, say
from benchmarks.live import Child, Reader, Source, child_spec, engine_replica
from processor._postgres.schema.tables import Tables
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC

PARTITIONS = s1_backlog.PARTITIONS
GOAL_P99_RATIO = 3.0


@dataclass(frozen=True)
class Options:
    rate: int = 1000
    seconds: int = 60
    rounds: int = 3

    @classmethod
    def of(cls, *, quick: bool, rate: int | None, rounds: int | None = None) -> Options:
        return cls(
            rate=rate or 1000, seconds=6 if quick else 60, rounds=rounds or (1 if quick else 3)
        )


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
    say(
        f"S2 latency at load: {options.rate} events/s for {options.seconds} s, "
        f"{options.rounds} round(s) of engine and raw, alternating which goes first"
    )
    # A checkpoint now also puts the next timed one past the first run; each side settles the
    # database after itself for the next.
    box.settle()
    rounds: list[dict[str, Any]] = []
    sides = {"engine": _engine, "raw": _raw}
    for n, measured in alternating(sides, options.rounds, found, box, options):
        engine, raw = measured["engine"], measured["raw"]
        ratio = engine["p99_ms"] / raw["p99_ms"] if raw["p99_ms"] > 0 else float("inf")
        say(
            f"round {n}: p99 engine {engine['p99_ms']:.1f} ms, raw {raw['p99_ms']:.1f} ms, "
            f"ratio {ratio:.2f}"
        )
        rounds.append({"engine": engine, "raw_e2e": raw, "p99_ratio": ratio})
    ratio = statistics.median(r["p99_ratio"] for r in rounds)
    return {
        "rate": options.rate,
        "seconds": options.seconds,
        "rounds": rounds,
        "engine": _medians([r["engine"] for r in rounds]),
        "raw_e2e": _medians([r["raw_e2e"] for r in rounds]),
        "p99_ratio": ratio,
        "goal": {"p99_ratio_at_most": GOAL_P99_RATIO, "passed": ratio <= GOAL_P99_RATIO},
    }


def _engine(found: Services, box: Scratch, options: Options, n: int) -> dict[str, Any]:
    # Topics of the round's own: a topic prefix per round.
    prefix = f"r{n}."
    source = box.topic(prefix + TRANSFER_EVENTS_TOPIC, PARTITIONS)
    commands = box.topic(prefix + ACCOUNT_COMMANDS_TOPIC, PARTITIONS)
    box.topic(prefix + "saga-dead-letters", 1)
    tables = box.schema(f"engine{n}")
    settings = s1_backlog.settings(found, tables, box.prefix + prefix).model_copy(
        update={"sagas": ["sagas.transfer:TransferSaga"]}
    )
    result = _measure(
        found,
        source,
        commands,
        engine_replica(f"s2-engine{n}", settings),
        lambda: wait_owned(found.database_url, tables, settings.consumer.group_id, PARTITIONS, 60),
        options,
        f"{box.run_id}e{n}",
    )
    say(f"  engine: p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms")
    box.settle(tables)
    return result


def _raw(found: Services, box: Scratch, options: Options, n: int) -> dict[str, Any]:
    raw_source = box.topic(f"raw-events-{n}", PARTITIONS)
    raw_sink = box.topic(f"raw-commands-{n}", PARTITIONS)
    raw_tables = box.schema(f"raw{n}")
    group = f"{box.prefix}raw{n}"
    spec = child_spec(
        kafka=found.kafka,
        url=found.database_url,
        schema=raw_tables.schema,
        source=raw_source,
        sink=raw_sink,
        batch_size=s1_backlog.BATCH_SIZE,
        group=group,
    )
    result = _measure(
        found,
        raw_source,
        raw_sink,
        Child(f"s2-raw{n}", ["-m", "benchmarks.raw_e2e", spec], {}),
        lambda: wait_owned(found.database_url, raw_tables, group, PARTITIONS, 60),
        options,
        f"{box.run_id}r{n}",
    )
    say(f"  raw end-to-end: p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms")
    box.settle(raw_tables)
    return result


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: statistics.median(r[k] for r in runs) for k in ("p50_ms", "p99_ms", "max_ms")}


def summary(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    e, r, g = result["engine"], result["raw_e2e"], result["goal"]
    at = f"at {result['rate']} events/s, {result['seconds']} s"
    each = " ".join(f"{x['p99_ratio']:.2f}" for x in result["rounds"])
    return [
        ("S2", f"engine latency {at}", f"p50 {e['p50_ms']:.1f} ms, p99 {e['p99_ms']:.1f} ms"),
        ("S2", "raw end-to-end latency", f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms"),
        (
            "S2",
            "engine p99 / raw p99",
            f"{result['p99_ratio']:.2f} (goal <= {g['p99_ratio_at_most']}: "
            f"{'PASS' if g['passed'] else 'BELOW'}); rounds {each}",
        ),
    ]
