"""S1, backlog drain: how fast one processor works off a preloaded backlog of saga starts.

N TransferRequested events for distinct sagas wait in a multi-partition input topic. One
processor (in-process, as a replica runs it) is started and timed from partition assignment until
every record is committed (the stored offsets reach the end offsets) and the outbox is empty
(every DebitAccount command is on the command topic). Each event costs a saga row, a history
row, an outbox row and a deadline, like the raw SQL limit it is compared with.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from confluent_kafka import Producer

from benchmarks import raw_limits
from benchmarks.common import Scratch, Services, end_offsets, kafka_config, say
from processor.messages import (
    HEADER_CORRELATION_ID,
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_OCCURRED_AT,
    HEADER_SCHEMA_VERSION,
    registry,
)
from processor.postgres.connect import connect
from processor.postgres.schema import Tables
from processor.runtime.processor import Processor
from processor.settings import ProcessorSettings
from sagas.transfer import TransferSaga
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC, TransferRequested

DEFAULT_EVENTS = 20_000
QUICK_EVENTS = 5_000
PARTITIONS = 6
BATCH_SIZE = 500
ACCEPTANCE = 0.5


@dataclass(frozen=True)
class Options:
    events: int
    profile: bool = False
    # The raw loops and the engine alternate, round after round: a disturbance on the shared
    # machine (a checkpoint, autovacuum, a neighbour) then hits one round, not one side.
    rounds: int = 3


def preload(kafka: str, topic: str, events: int, run_id: str) -> None:
    """Publishes the backlog as an upstream service would: key = saga id, full headers."""
    producer = Producer({**kafka_config(kafka), "linger.ms": 20, "enable.idempotence": True})
    mtype = registry.of(TransferRequested)
    failed: list[Any] = []
    t0 = time.monotonic()
    for i in range(events):
        tid = f"tr-{run_id}-{i:07d}"
        event = TransferRequested(
            transfer_id=tid,
            source_account_id=f"acc-{i % 1000}",
            target_account_id=f"acc-{(i + 1) % 1000}",
            amount=Decimal("10.00"),
        )
        headers = [
            (HEADER_MESSAGE_ID, str(uuid.uuid4()).encode()),
            (HEADER_MESSAGE_TYPE, mtype.name.encode()),
            (HEADER_SCHEMA_VERSION, str(mtype.version).encode()),
            (HEADER_CORRELATION_ID, tid.encode()),
            (HEADER_OCCURRED_AT, datetime.now(UTC).isoformat().encode()),
        ]
        raw_limits.produce(
            producer,
            topic,
            key=tid.encode(),
            value=event.model_dump_json().encode(),
            headers=headers,
            on_delivery=lambda err, _m: failed.append(err) if err else None,
        )
        if i % 5000 == 4999:
            producer.poll(0)
            say(f"  preloaded {i + 1}/{events} events")
    if producer.flush(60) or failed:
        raise RuntimeError(f"preload failed: {failed[:1]}")
    say(f"  preloaded {events} events in {time.monotonic() - t0:.1f} s")


def settings(
    found: Services, tables: Tables, prefix: str, group: str = "group"
) -> ProcessorSettings:
    """Production defaults, except the scratch names and a consumer session short enough to
    leave the group promptly when the run ends."""
    return ProcessorSettings(
        kafka={"bootstrap_servers": found.kafka, "config": {"log_level": "3"}},
        database={"url": found.database_url, "schema_name": tables.schema},
        consumer={
            "group_id": f"{prefix}{group}",
            "batch_size": BATCH_SIZE,
            "session_timeout": "10s",
        },
        topic_prefix=prefix,
        shutdown_timeout="10s",
    )


class _Profiled:
    """Profiles loading and planning a batch, on the consuming thread."""

    def __init__(self, apply: Any) -> None:
        self.apply = apply
        self.profile = cProfile.Profile()

    def __call__(self, *args: Any) -> Any:
        self.profile.enable()
        try:
            return self.apply(*args)
        finally:
            self.profile.disable()

    def report(self, limit: int = 30) -> str:
        out = io.StringIO()
        stats = pstats.Stats(self.profile, stream=out)
        stats.sort_stats("tottime").print_stats(limit)
        return out.getvalue()


class _Phases:
    """Wall and CPU time of the worker's phases and of the relay, without a profiler's cost.

    Wraps the running processor's bound methods in place; CPU time is the calling thread's.
    The consuming thread reads, decodes, loads and plans batch N+1 ("step" minus the waits)
    while the writer thread writes and commits batch N ("commit"), and the relay has a thread
    of its own, so the phases overlap and do not add up to the wall time per event.
    """

    PROBES = (
        ("step", "worker", "poll_once"),
        ("route", "planner", "route"),
        ("plan", "planner", "plan"),
        ("load", "control", "load"),
        ("commit", "worker", "_write"),
        ("relay", "relay", "run_once"),
    )

    def __init__(self) -> None:
        self.wall: defaultdict[str, float] = defaultdict(float)
        self.cpu: defaultdict[str, float] = defaultdict(float)

    def install(self, proc: Processor) -> None:
        assert proc.worker is not None
        owners = {
            "worker": proc.worker,
            "planner": proc.worker.planner,
            "control": proc.worker.control,
            "relay": proc.relay,
        }
        for label, owner, method in self.PROBES:
            setattr(owners[owner], method, self._timed(label, getattr(owners[owner], method)))

    def _timed(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall[label] += time.perf_counter() - wall
                self.cpu[label] += time.thread_time() - cpu

        return timed

    def per_event(self, events: int) -> dict[str, dict[str, float]]:
        """Microseconds per event, per phase (see the class docstring: phases overlap)."""
        wall, cpu = defaultdict(float, self.wall), defaultdict(float, self.cpu)
        labels = ["step", "route", "plan", "load", "commit", "relay"]
        return {
            k: {"wall_us": wall[k] / events * 1e6, "cpu_us": cpu[k] / events * 1e6} for k in labels
        }


@dataclass
class _Drain:
    """What the watcher saw: when the clock started and stopped, and the last counts."""

    started: float
    t0: float | None = None
    done: float | None = None
    committed: int = 0
    pending: int = 0


def _watch(
    proc: Processor, found: Services, tables: Tables, total: int, failure: list[Any]
) -> _Drain:
    """Polls the stored offsets and the outbox until both say the backlog is drained."""
    assert proc.worker is not None
    assert proc.relay is not None
    check = tables.render(
        "SELECT (SELECT coalesce(sum(next_offset), 0) FROM {offsets} WHERE group_id = %s),"
        " (SELECT count(*) FROM {outbox})"
    )
    drain = _Drain(started=time.perf_counter())
    give_up = drain.started + max(120.0, total / 100)
    next_report = drain.started + 2.0
    with connect(found.database_url, autocommit=True) as conn:
        while time.perf_counter() < give_up and not failure:
            now = time.perf_counter()
            if drain.t0 is None and proc.worker.owned:
                # The clock starts at assignment: joining the group is not backlog work.
                drain.t0 = now
                say(f"  partitions assigned after {now - drain.started:.1f} s; clock started")
            row = conn.execute(check, (proc.settings.consumer.group_id,)).fetchone()
            drain.committed, drain.pending = (int(row[0]), int(row[1])) if row else (0, 0)
            if drain.committed >= total and drain.pending == 0:
                drain.done = now
                break
            if now >= next_report:
                rate = drain.committed / (now - drain.t0) if drain.t0 and now > drain.t0 else 0.0
                say(
                    f"  committed {drain.committed}/{total}, outbox {drain.pending}, "
                    f"published {proc.relay.published} ({rate:,.0f} events/s)"
                )
                next_report = now + 2.0
            time.sleep(0.02)
    return drain


def run_engine(
    found: Services,
    tables: Tables,
    prefix: str,
    source: str,
    events: int,
    *,
    profile: bool,
    group: str = "group",
) -> dict[str, Any]:
    proc = Processor(settings(found, tables, prefix, group), [TransferSaga])
    proc.start()
    assert proc.worker is not None
    assert proc.relay is not None
    phases = _Phases()
    phases.install(proc)
    profiled = None
    if profile:
        profiled = _Profiled(proc.worker._plan)
        proc.worker._plan = profiled  # type: ignore[method-assign, assignment]
    failure: list[BaseException] = []

    def target() -> None:
        try:
            proc.run()
        except BaseException as e:  # reported below, after the clock stops
            failure.append(e)

    thread = threading.Thread(target=target, name="bench-processor", daemon=True)
    thread.start()
    try:
        total = sum(end_offsets(found.kafka, source).values())
        drain = _watch(proc, found, tables, total, failure)
    finally:
        # Stopped before anything else, so scratch schemas are never dropped under it.
        proc.stop()
        thread.join(30)
    if failure:
        raise RuntimeError("processor failed") from failure[0]
    if drain.done is None or drain.t0 is None:
        raise RuntimeError(
            f"not drained in time: committed {drain.committed}/{total}, outbox {drain.pending}"
        )
    seconds = drain.done - drain.t0
    stats = proc.worker.stats
    result = {
        "events": events,
        "seconds": seconds,
        "events_per_s": events / seconds,
        "batches": stats.batches,
        "records": stats.records,
        "events_per_commit": stats.records / stats.batches if stats.batches else 0.0,
        "rejected_batches": stats.rejected_batches,
        "published": proc.relay.published,
        "counts": dict(stats.counts),
        "time_per_event_us": phases.per_event(stats.records or 1),
    }
    if profiled is not None:
        result["profile"] = profiled.report()
    return result


def run(found: Services, box: Scratch, options: Options) -> dict[str, Any]:
    events = options.events
    say(
        f"S1 backlog drain: {events} events over {PARTITIONS} partitions, batch size "
        f"{BATCH_SIZE}, {options.rounds} rounds of raw loops then engine"
    )
    source = box.topic(TRANSFER_EVENTS_TOPIC, PARTITIONS)
    commands = box.topic(ACCOUNT_COMMANDS_TOPIC, PARTITIONS)
    box.topic("saga-dead-letters", 1)
    sink = box.topic("raw-sink", PARTITIONS)
    preload(found.kafka, source, events, box.run_id)

    every = max(BATCH_SIZE, events // 4 // BATCH_SIZE * BATCH_SIZE)
    rounds: list[dict[str, Any]] = []
    for n in range(1, options.rounds + 1):
        say(f"round {n}: raw Kafka loop: consume(500) -> produce -> flush, no database")
        kafka = raw_limits.kafka_loop(found.kafka, source, sink, events, BATCH_SIZE)
        say(f"  {kafka.count} records in {kafka.seconds:.2f} s = {kafka.rate:,.0f} records/s")

        say(f"round {n}: raw SQL loop: the engine's load + write per batch, relay claim-delete")
        sql = raw_limits.sql_loop(
            found.database_url,
            box.schema(f"rawsql{n}"),
            events=events,
            batch_size=BATCH_SIZE,
            partitions=PARTITIONS,
            topic=source,
            progress=lambda k: say(f"  {k}/{events} events") if k % every == 0 else None,
        )
        say(f"  {sql.count} events in {sql.seconds:.2f} s = {sql.rate:,.0f} events/s")

        say(f"round {n}: engine: one processor drains the backlog (consumer, planner, relay)")
        before = sum(end_offsets(found.kafka, commands).values())
        engine = run_engine(
            found,
            box.schema(f"engine{n}"),
            box.prefix,
            source,
            events,
            profile=options.profile and n == 1,
            group=f"group{n}",
        )
        delivered = sum(end_offsets(found.kafka, commands).values()) - before
        limit = min(kafka.rate, sql.rate)
        ratio = engine["events_per_s"] / limit
        say(
            f"  {events} events in {engine['seconds']:.2f} s = "
            f"{engine['events_per_s']:,.0f} events/s, {engine['events_per_commit']:.0f} "
            f"events per commit, {delivered} commands delivered; ratio {ratio:.2f}"
        )
        say(
            "  time per event, wall/cpu us: "
            + ", ".join(
                f"{k} {v['wall_us']:.0f}/{v['cpu_us']:.0f}"
                for k, v in engine["time_per_event_us"].items()
            )
            + " (phases overlap: see benchmarks/s1_backlog.py)"
        )
        if "profile" in engine:
            print(engine.pop("profile"), flush=True)
        rounds.append(
            {
                "raw_kafka": {
                    "records": kafka.count,
                    "seconds": kafka.seconds,
                    "records_per_s": kafka.rate,
                },
                "raw_sql": {"events": sql.count, "seconds": sql.seconds, "events_per_s": sql.rate},
                "engine": engine,
                "commands_delivered": delivered,
                "limit_events_per_s": limit,
                "ratio": ratio,
            }
        )
    ratio = statistics.median(r["ratio"] for r in rounds)
    complete = all(r["commands_delivered"] == events for r in rounds)
    return {
        "events": events,
        "partitions": PARTITIONS,
        "batch_size": BATCH_SIZE,
        "rounds": rounds,
        "raw_kafka": {"records_per_s": _median(rounds, "raw_kafka", "records_per_s")},
        "raw_sql": {"events_per_s": _median(rounds, "raw_sql", "events_per_s")},
        "engine": {
            "events_per_s": _median(rounds, "engine", "events_per_s"),
            "events_per_commit": rounds[0]["engine"]["events_per_commit"],
        },
        "ratio": ratio,
        "ratios": [r["ratio"] for r in rounds],
        "acceptance": {
            "ratio_at_least": ACCEPTANCE,
            "statistic": "median of the per-round ratios",
            "passed": ratio >= ACCEPTANCE and complete,
        },
    }


def _median(rounds: list[dict[str, Any]], side: str, key: str) -> float:
    return float(statistics.median(r[side][key] for r in rounds))


def summary(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    e = result["engine"]
    acc = result["acceptance"]
    return [
        ("S1", "raw Kafka loop", f"{result['raw_kafka']['records_per_s']:,.0f} records/s"),
        ("S1", "raw SQL loop", f"{result['raw_sql']['events_per_s']:,.0f} events/s"),
        (
            "S1",
            "engine drain",
            f"{e['events_per_s']:,.0f} events/s (median, {result['events']} events)",
        ),
        ("S1", "events per commit", f"{e['events_per_commit']:.0f}"),
        (
            "S1",
            "ratio to min(raw)",
            f"median {result['ratio']:.2f} of "
            f"{', '.join(f'{r:.2f}' for r in result['ratios'])} "
            f"(need >= {acc['ratio_at_least']}: "
            f"{'PASS' if acc['passed'] else 'FAIL'})",
        ),
    ]
