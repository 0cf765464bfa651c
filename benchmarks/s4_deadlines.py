"""S4, deadlines: firing precision of one poller with a large table of pending deadlines.

A dedicated schema's deadline table is bulk-loaded with far-future deadlines, then rows are
inserted ahead of time so that `rate` come due each second for `seconds` seconds (due times spread
evenly), followed by a burst all due at one instant. One DeadlinePoller with default settings
fires them to a multi-partition topic. Firing lag is each deadline-fired record's Kafka timestamp
minus its `due_at` (carried in the record), for the steady phase and the burst separately.

Only the poller -> Kafka half is measured: no consumer handles the fired records, so fired rows
stay in the table as dispatched (the consumer would delete them), and redispatch is pushed past
the end of the run so nothing fires twice.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from benchmarks import raw_limits
from benchmarks.common import Scratch, Services, end_offsets, kafka_config, percentile, say
from processor.kafka.producer import KafkaRecordProducer, make_producer
from processor.postgres.connect import connect
from processor.postgres.deadlines import PostgresDeadlineStore
from processor.postgres.schema import Tables
from processor.runtime.poller import DeadlinePoller
from processor.settings import DeadlineSettings

PARTITIONS = 6
LEAD_SECONDS = 5.0  # from inserting the timed rows to the first due time: the poller starts
BURST_GAP_SECONDS = 5.0  # between the steady phase's last due time and the burst
ACCEPTANCE_P99_MS = 100.0
LOAD_CHUNK = 100_000


@dataclass(frozen=True)
class Options:
    pending: int = 1_000_000
    seconds: int = 60
    rate: int = 1000
    burst: int = 100_000

    @classmethod
    def of(cls, *, quick: bool, **given: int | None) -> Options:
        base = cls(pending=100_000, seconds=20, burst=20_000) if quick else cls()
        return replace(base, **{k: v for k, v in given.items() if v is not None})


def _insert(conn: Any, tables: Tables, sql_select: str, args: tuple[Any, ...]) -> None:
    conn.execute(
        tables.render(
            "INSERT INTO {deadline} (id, saga_type, saga_id, name, due_at, topic, partition) "
        )
        + sql_select,
        args,
    )


def load_pending(url: str, tables: Tables, topic: str, count: int) -> None:
    """Far-future deadlines (a month ahead), loaded set-based in chunks so progress shows."""
    t0 = time.monotonic()
    with connect(url, autocommit=True) as conn:
        for first in range(0, count, LOAD_CHUNK):
            last = min(count, first + LOAD_CHUNK)
            _insert(
                conn,
                tables,
                "SELECT gen_random_uuid(), 'bench-saga', 'pending-' || g, 'far', "
                "now() + interval '30 days' + g * interval '1 second', %s, g %% %s::int "
                "FROM generate_series(%s::int, %s::int) AS g",
                (topic, PARTITIONS, first, last - 1),
            )
            say(f"  loaded {last}/{count} pending deadlines")
        # A table that grew over months has been vacuumed and analysed; so is this one.
        conn.execute(tables.render("VACUUM ANALYZE {deadline}"))
    say(f"  {count} pending deadlines ready in {time.monotonic() - t0:.1f} s")


def measure_raw(found: Services, tables: Tables, topic: str, count: int, batch: int) -> Any:
    """The raw claim-and-produce limit over `count` rows already due, beside the pending ones."""
    with connect(found.database_url, autocommit=True) as conn:
        _insert(
            conn,
            tables,
            "SELECT gen_random_uuid(), 'bench-saga', 'raw-' || g, 'raw', "
            "now() - interval '1 minute', %s, g %% %s::int FROM generate_series(1, %s::int) AS g",
            (topic, PARTITIONS, count),
        )
        conn.execute(tables.render("ANALYZE {deadline}"))
    measured = raw_limits.deadline_loop(
        found.database_url, tables, found.kafka, expected=count, batch_size=batch
    )
    with connect(found.database_url, autocommit=True) as conn:
        # Leave the table as the poller would find it in production: vacuumed after churn.
        conn.execute(tables.render("VACUUM ANALYZE {deadline}"))
    return measured


def schedule_timed(url: str, tables: Tables, topic: str, o: Options) -> tuple[datetime, datetime]:
    """Inserts the steady rows and the burst ahead of time; returns (first due, burst due)."""
    with connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        start: datetime = row[0] + timedelta(seconds=LEAD_SECONDS)
        burst_at = start + timedelta(seconds=o.seconds + BURST_GAP_SECONDS)
        _insert(
            conn,
            tables,
            "SELECT gen_random_uuid(), 'bench-saga', 'steady-' || g, 'steady', "
            "%s + g * make_interval(secs => %s), %s, g %% %s::int "
            "FROM generate_series(0, %s::int) AS g",
            (start, 1.0 / o.rate, topic, PARTITIONS, o.rate * o.seconds - 1),
        )
        _insert(
            conn,
            tables,
            "SELECT gen_random_uuid(), 'bench-saga', 'burst-' || g, 'burst', %s, %s, g %% %s::int "
            "FROM generate_series(1, %s::int) AS g",
            (burst_at, topic, PARTITIONS, o.burst),
        )
    return start, burst_at


def run_poller(found: Services, tables: Tables, o: Options, burst_at: datetime) -> int:
    settings = DeadlineSettings(redispatch_after=timedelta(hours=1))
    poller = DeadlinePoller(
        PostgresDeadlineStore(
            lambda: connect(found.database_url, application_name="bench-poller"), tables
        ),
        KafkaRecordProducer(lambda: make_producer(kafka_config(found.kafka), partitioner="crc32")),
        holder=f"bench-{uuid.uuid4().hex[:6]}",
        settings=settings,
    )
    stop = threading.Event()
    thread = threading.Thread(target=poller.run, args=(stop,), name="bench-poller", daemon=True)
    thread.start()
    expected = o.rate * o.seconds + o.burst
    wall_burst = burst_at.timestamp()
    give_up = wall_burst + 60 + o.burst / 500
    next_report = 0.0
    try:
        while poller.fired < expected and time.time() < give_up:
            if time.monotonic() >= next_report:
                phase = "burst" if time.time() >= wall_burst else "steady"
                say(f"  {phase}: fired {poller.fired}/{expected}")
                next_report = time.monotonic() + 5.0
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(30)
    return poller.fired


def read_fired(kafka: str, topic: str) -> dict[str, tuple[str, float, float]]:
    """deadline id -> (name, due ms, first Kafka timestamp ms), from the fired records."""
    ends = end_offsets(kafka, topic)
    consumer = Consumer(
        {
            **kafka_config(kafka),
            "group.id": f"bench-read-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    remaining = sum(ends.values())
    seen: dict[str, tuple[str, float, float]] = {}
    give_up = time.monotonic() + 120
    try:
        while remaining > 0 and time.monotonic() < give_up:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                if msg.error() is not None:
                    continue
                remaining -= 1
                body = json.loads(msg.value() or b"{}")
                due = datetime.fromisoformat(body["due_at"]).timestamp() * 1000
                ts = float(msg.timestamp()[1])
                first = seen.get(body["deadline_id"])
                if first is None or ts < first[2]:
                    seen[body["deadline_id"]] = (body["name"], due, ts)
    finally:
        consumer.close()
    return seen


def _lags(values: list[float]) -> dict[str, Any]:
    values.sort()
    return {
        "count": len(values),
        "p50_ms": percentile(values, 50),
        "p99_ms": percentile(values, 99),
        "max_ms": values[-1] if values else float("nan"),
    }


def _worst_by_second(records: dict[str, tuple[str, float, float]], start: datetime) -> list[float]:
    """The largest steady-phase lag in each second of due times, to show when lag happened."""
    base = start.timestamp() * 1000
    worst: dict[int, float] = {}
    for name, due, ts in records.values():
        if name == "steady":
            second = int((due - base) // 1000)
            worst[second] = max(worst.get(second, 0.0), ts - due)
    return [round(worst.get(i, 0.0)) for i in range(max(worst, default=-1) + 1)]


def run(found: Services, box: Scratch, o: Options) -> dict[str, Any]:
    say(
        f"S4 deadlines: {o.pending:,} pending, {o.rate}/s due for {o.seconds} s, "
        f"then a burst of {o.burst:,} at one instant; poller -> Kafka only (no consumer)"
    )
    topic = box.topic("deadline-fired", PARTITIONS)
    raw_topic = box.topic("raw-fired", PARTITIONS)
    tables = box.schema("deadlines")
    load_pending(found.database_url, tables, topic, o.pending)

    batch = DeadlineSettings().polling.batch_size
    say(f"raw claim-and-produce loop: DELETE ... RETURNING {batch} + produce + flush, no lease")
    raw = measure_raw(found, tables, raw_topic, o.burst, batch)
    say(f"  {raw.count} fired in {raw.seconds:.2f} s = {raw.rate:,.0f} deadlines/s")

    start, burst_at = schedule_timed(found.database_url, tables, topic, o)
    say(
        f"poller: first due in {LEAD_SECONDS:.0f} s, "
        f"burst at +{LEAD_SECONDS + o.seconds + BURST_GAP_SECONDS:.0f} s"
    )
    fired = run_poller(found, tables, o, burst_at)
    say(f"  poller fired {fired}; reading the fired records back")
    records = read_fired(found.kafka, topic)

    steady = [ts - due for name, due, ts in records.values() if name == "steady"]
    bursts = [(due, ts) for name, due, ts in records.values() if name == "burst"]
    burst_lags = [ts - due for due, ts in bursts]
    steady_result = _lags(steady)
    steady_result["worst_by_second"] = _worst_by_second(records, start)
    burst_result = _lags(burst_lags)
    if steady:
        first_due = start.timestamp() * 1000
        last_ts = max(ts for name, _, ts in records.values() if name == "steady")
        steady_result["fire_rate_per_s"] = len(steady) / max(1e-3, (last_ts - first_due) / 1000)
    if bursts:
        drain = max(ts for _, ts in bursts) - burst_at.timestamp() * 1000
        burst_result["fire_rate_per_s"] = len(bursts) / max(1e-3, drain / 1000)
    burst_rate = burst_result.get("fire_rate_per_s", 0.0)
    complete = len(steady) == o.rate * o.seconds and len(bursts) == o.burst
    p99 = steady_result["p99_ms"]
    passed = complete and p99 <= ACCEPTANCE_P99_MS
    say(f"  worst steady lag per second of due times (ms): {steady_result['worst_by_second']}")
    for label, res in (("steady", steady_result), ("burst", burst_result)):
        say(
            f"  {label}: {res['count']} fired, lag p50 {res['p50_ms']:.0f} ms, "
            f"p99 {res['p99_ms']:.0f} ms, max {res['max_ms']:.0f} ms, "
            f"{res.get('fire_rate_per_s', 0):,.0f}/s"
        )
    return {
        "options": o.__dict__,
        "partitions": PARTITIONS,
        "poller_batch_size": batch,
        "scope": "poller -> Kafka only; the consumer side is not part of S4",
        "raw_claim_produce": {"fired": raw.count, "seconds": raw.seconds, "per_s": raw.rate},
        "steady": steady_result,
        "burst": burst_result,
        "burst_rate_ratio_to_raw": burst_rate / raw.rate if raw.rate else 0.0,
        "complete": complete,
        "acceptance": {"steady_p99_ms_at_most": ACCEPTANCE_P99_MS, "passed": passed},
    }


def summary(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    s, b, o = result["steady"], result["burst"], result["options"]
    acc = result["acceptance"]
    verdict = "PASS" if acc["passed"] else "FAIL"
    return [
        ("S4", "pending deadlines", f"{o['pending']:,}"),
        (
            "S4",
            "raw claim+produce loop",
            f"{result['raw_claim_produce']['per_s']:,.0f} deadlines/s",
        ),
        (
            "S4",
            f"steady lag ({o['rate']}/s)",
            f"p50 {s['p50_ms']:.0f} ms, p99 {s['p99_ms']:.0f} ms, max {s['max_ms']:.0f} ms "
            f"(need p99 <= {acc['steady_p99_ms_at_most']:.0f} ms: {verdict})",
        ),
        (
            "S4",
            f"burst lag ({o['burst']:,} at once)",
            f"p50 {b['p50_ms']:.0f} ms, p99 {b['p99_ms']:.0f} ms, max {b['max_ms']:.0f} ms",
        ),
        (
            "S4",
            "burst fire rate",
            f"{b.get('fire_rate_per_s', 0):,.0f}/s = {result['burst_rate_ratio_to_raw']:.2f} x raw",
        ),
        ("S4", "scope", "poller -> Kafka only; consumer side not measured"),
    ]
