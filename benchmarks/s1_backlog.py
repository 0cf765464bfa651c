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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from confluent_kafka import Producer

from benchmarks import boxcpu, peer_quix, raw_e2e, raw_limits, raw_sql
from benchmarks.boxcpu import Meter, Usage
from benchmarks.common import Scratch, Services, end_offsets, kafka_config, say
from benchmarks.raw_sql import Measured
from processor._authoring.messages import (
    HEADER_CORRELATION_ID,
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_OCCURRED_AT,
    HEADER_SCHEMA_VERSION,
    registry,
)
from processor._bootstrap.processor import build_processor
from processor._postgres.connect import connect
from processor._postgres.schema.tables import Tables
from processor._runtime.processor import Processor
from processor._schemas.formats import frame_header
from processor.settings import ProcessorSettings
from sagas.transfer import TransferSaga
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC, TransferRequested

DEFAULT_EVENTS = 20_000
QUICK_EVENTS = 3_000
PARTITIONS = 6
BATCH_SIZE = 500
# The goals (benchmark goals only), each on the median of the rounds: the engine's rate
# as a ratio of each limit's at least ...
GOALS = {"raw_e2e": 0.8, "min_raw_kafka_sql": 0.5, "quix_500": 1.0}
# ... its costs as a ratio of the raw end-to-end loop's in the same round at most (absolute CPU
# does not carry across machines; the ratio does) ...
COST_GOALS = {"processor_vs_raw_e2e": 2.0}
# ... and its own costs at most: WAL records per event (every row and index entry written is
# one: what the design writes, whatever the machine) and the replica's peak resident set.
CEILINGS = {"wal_records": 10.0, "peak_rss_mb": 300.0}
# The peer's checkpoint sizes: the engine's batch, and a larger one beside it. Its timer scales
# with the count (100 ms per 500 messages, the engine's batch timeout per batch), so that in a
# backlog the count, not the timer, sets the checkpoint size.
QUIX_COMMIT_EVERY = (500, 2000)


@dataclass(frozen=True)
class Options:
    events: int
    profile: bool = False
    # The raw loops and the engine alternate, round after round: a disturbance on the shared
    # machine (a checkpoint, autovacuum, a neighbour) then hits one round, not one side.
    rounds: int = 3


def preload(kafka: str, topic: str, events: int, run_id: str, schema_id: int | None = None) -> None:
    """Publishes the backlog as an upstream service would: key = saga id, full headers.

    With ``schema_id``, each value is framed for a Schema Registry (JSON Schema: the five
    bytes of the frame, then the same JSON), as our publisher frames a registry topic.
    """
    frame = frame_header(schema_id) if schema_id is not None else b""
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
            value=frame + event.model_dump_json().encode(),
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
    found: Services,
    tables: Tables,
    prefix: str,
    group: str = "group",
    history_payload: str = "full",
    handler_settings: Mapping[str, Any] | None = None,
    schema_registry: Mapping[str, Any] | None = None,
) -> ProcessorSettings:
    """Production defaults, except the scratch names and a consumer session short enough to
    leave the group promptly when the run ends; ``handler_settings`` are the sagas' own."""
    return ProcessorSettings(
        schema_registry=dict(schema_registry or {}),
        settings=dict(handler_settings or {}),
        history={"payload": history_payload},
        kafka={"bootstrap_servers": found.kafka, "config": {"log_level": "3"}},
        database={"url": found.database_url, "schema_name": tables.schema},
        consumer={
            "group_id": f"{prefix}{group}",
            "batch_size": BATCH_SIZE,
            "session_timeout": "10s",
        },
        topic_prefix=prefix,
        shutdown_timeout="10s",
        # Several replicas on one machine: each takes a free port for its metrics endpoint.
        metrics={"bind_any": True, "host": "127.0.0.1"},
    )


class _Profiled:
    """cProfile of the engine's hot path: the batch step (read, decode, load, plan) on the
    consuming thread, the write and commit on the writer thread, the relay's round on its own.

    One profiler per wrapped method: a profiler sees only the thread that enabled it.
    """

    TARGETS = (("worker", "poll_once"), ("steps", "write"), ("relay", "run_once"))

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []

    def install(self, proc: Processor) -> None:
        assert proc.worker is not None
        owners = {"worker": proc.worker, "steps": proc.worker._steps, "relay": proc.relay}
        for owner, method in self.TARGETS:
            fn = getattr(owners[owner], method, None)
            if fn is None:
                raise RuntimeError(f"no {owner}.{method} to profile: update _Profiled.TARGETS")
            setattr(owners[owner], method, self._wrap(fn))

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        profile = cProfile.Profile()
        self.profiles.append(profile)

        def profiled(*args: Any, **kwargs: Any) -> Any:
            profile.enable()
            try:
                return fn(*args, **kwargs)
            finally:
                profile.disable()

        return profiled

    def stats(self) -> pstats.Stats | None:
        if not self.profiles:
            return None
        out = pstats.Stats(self.profiles[0], stream=io.StringIO())
        for more in self.profiles[1:]:
            out.add(more)
        return out

    def report(self, limit: int = 30) -> str:
        stats = self.stats()
        if stats is None:
            return ""
        text = io.StringIO()
        stats.stream = text  # type: ignore[attr-defined]
        stats.sort_stats("tottime").print_stats(limit)
        stats.sort_stats("cumulative").print_stats(limit)
        return text.getvalue()


class _Phases:
    """Wall and CPU time of the worker's phases and of the relay, without a profiler's cost.

    Wraps the running processor's bound methods in place; CPU time is the calling thread's.
    The consuming thread reads, decodes, loads and plans batch N+1 ("step" minus the waits)
    while the writer thread writes and commits batch N ("commit"), and the relay has a thread
    of its own, so the phases overlap and do not add up to the wall time per event.
    """

    PROBES = (
        ("step", "worker", "poll_once"),
        ("route", "planner", "prepare"),
        ("plan", "planner", "plan"),
        ("load", "control", "load"),
        ("commit", "steps", "write"),
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
            # The writer lane calls the batch steps' write through the attribute each time.
            "steps": proc.worker._steps,
            "relay": proc.relay,
        }
        for label, owner, method in self.PROBES:
            # A probe the engine renamed away would report a phase of zero: refuse instead.
            fn = getattr(owners[owner], method, None)
            if fn is None:
                raise RuntimeError(f"no {owner}.{method} to time: update _Phases.PROBES")
            setattr(owners[owner], method, self._timed(label, fn))

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
    cpu0: float = 0.0
    cpu_done: float = 0.0
    committed: int = 0
    pending: int = 0
    box0: Usage | None = None
    box_done: Usage | None = None
    # The watcher's own CPU over the window: it runs in the processor's process (it reads the
    # worker's counters every 20 ms, then polls the database), and is taken out of the
    # processor's CPU.
    watcher: float = 0.0


def _watch(
    proc: Processor,
    found: Services,
    tables: Tables,
    total: int,
    failure: list[Any],
    meter: Meter | None,
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
                watched = time.thread_time()
                drain.t0, drain.cpu0 = now, time.process_time()
                drain.box0 = meter.read() if meter else None
                say(f"  partitions assigned after {now - drain.started:.1f} s; clock started")
            # The database is asked only once the worker counts the whole backlog committed:
            # a query every 20 ms through a Citus coordinator, fanned out over every shard on
            # the by-bucket side, took a fifth of a core from the drain it measured.
            if proc.worker.stats.records < total:
                drain.committed = proc.worker.stats.records
            else:
                row = conn.execute(check, (proc.settings.consumer.group_id,)).fetchone()
                drain.committed, drain.pending = (int(row[0]), int(row[1])) if row else (0, 0)
            if drain.committed >= total and drain.pending == 0:
                drain.done, drain.cpu_done = now, time.process_time()
                drain.box_done = meter.read() if meter else None
                drain.watcher = time.thread_time() - watched
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
    profile: bool = False,
    group: str = "group",
    history_payload: str = "full",
    meter: Meter | None = None,
    sagas: Sequence[type[Any]] = (TransferSaga,),
    handler_settings: Mapping[str, Any] | None = None,
    schema_registry: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    # The replica's peak resident set from here to the end of the drain: the high-water mark is
    # the process's, so it starts from what the harness already holds (reported beside it).
    rss_at_start = boxcpu.reset_peak_rss()
    proc = build_processor(
        settings(found, tables, prefix, group, history_payload, handler_settings, schema_registry),
        sagas,
    )
    proc.start()
    assert proc.worker is not None
    assert proc.relay is not None
    phases = _Phases()
    phases.install(proc)
    profiled = None
    if profile:
        profiled = _Profiled()
        profiled.install(proc)
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
        drain = _watch(proc, found, tables, total, failure, meter)
        peak_rss = boxcpu.peak_rss_mb()
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
        # The whole process: consumer, planner, writer and relay threads (and this watcher).
        "cpu_us": (drain.cpu_done - drain.cpu0 - drain.watcher) / events * 1e6,
        "watcher_cpu_us": drain.watcher / events * 1e6,
        "batches": stats.batches,
        "records": stats.records,
        "events_per_commit": stats.records / stats.batches if stats.batches else 0.0,
        "rejected_batches": stats.rejected_batches,
        "published": proc.relay.published,
        "counts": dict(stats.counts),
        "time_per_event_us": phases.per_event(stats.records or 1),
        "rss_at_start_mb": rss_at_start,
        "peak_rss_mb": peak_rss,
    }
    if drain.box0 is not None and drain.box_done is not None:
        result.update(drain.box_done.minus(drain.box0).without(drain.watcher).per_event(events))
    if profiled is not None:
        result["profile"] = profiled.report()
        result["profile_stats"] = profiled.stats()
    return result


def _side(m: Measured) -> dict[str, Any]:
    side: dict[str, Any] = {
        "events": m.count,
        "seconds": m.seconds,
        "events_per_s": m.rate,
        "cpu_us": m.cpu_us,
    }
    if m.box is not None:
        side.update(m.box.per_event(m.count))
    return side


def _quix(
    found: Services, source: str, sink: str, events: int, every: int, meter: Meter
) -> Measured:
    return peer_quix.quix_loop(
        found.kafka,
        source,
        sink,
        events=events,
        commit_every=every,
        commit_interval=0.1 * every / BATCH_SIZE,
        meter=meter,
    )


def run(found: Services, box: Scratch, options: Options) -> dict[str, Any]:
    events = options.events
    quix = peer_quix.available()
    say(
        f"S1 backlog drain: {events} events over {PARTITIONS} partitions, batch size "
        f"{BATCH_SIZE}, {options.rounds} alternating rounds of raw loops, peer and engine"
    )
    if not quix:
        say(
            f"Quix Streams peer skipped: no {peer_quix.PYTHON} (`make bench` makes it with the "
            "`bench` extra)"
        )
    meter = Meter.find(found.kafka, found.database_url)
    say(
        f"whole-box CPU: this process, postmaster pid {meter.postmaster or 'not on this machine'}"
        f", broker pid {meter.broker or 'not on this machine'}"
    )
    source = box.topic(TRANSFER_EVENTS_TOPIC, PARTITIONS)
    commands = box.topic(ACCOUNT_COMMANDS_TOPIC, PARTITIONS)
    box.topic("saga-dead-letters", 1)
    sink = box.topic("raw-sink", PARTITIONS)
    quix_sink = box.topic("quix-sink", PARTITIONS)
    preload(found.kafka, source, events, box.run_id)
    framed = _framed(found, box, events)
    if quix:
        # The peer's first drain meets a cold broker (its transaction coordinator, the changelog
        # topics' first creation, the JVM's JIT): done once, untimed, so that no round pays it.
        warm = _quix(found, source, quix_sink, events, QUIX_COMMIT_EVERY[0], meter)
        say(f"Quix warm-up drain (untimed): {warm.rate:,.0f} events/s")

    rounds: list[dict[str, Any]] = []
    for n in range(1, options.rounds + 1):
        sides: dict[str, Any] = {}
        kafka = raw_limits.kafka_loop(found.kafka, source, sink, events, BATCH_SIZE, meter)
        sides["raw_kafka"] = _side(kafka)
        sql_tables = box.schema(f"rawsql{n}")
        wal = boxcpu.wal_records(found.database_url)
        sql = raw_sql.sql_loop(
            found.database_url,
            sql_tables,
            events=events,
            batch_size=BATCH_SIZE,
            partitions=PARTITIONS,
            topic=source,
            meter=meter,
        )
        sides["raw_sql"] = {**_side(sql), "wal_records": _wal(found, wal, events)}
        box.settle(sql_tables)
        e2e_tables = box.schema(f"rawe2e{n}")
        wal = boxcpu.wal_records(found.database_url)
        e2e = raw_e2e.e2e_loop(
            found.kafka,
            found.database_url,
            e2e_tables,
            source,
            sink,
            batch_size=BATCH_SIZE,
            expected=events,
            meter=meter,
        )
        sides["raw_e2e"] = {**_side(e2e), "wal_records": _wal(found, wal, events)}
        box.settle(e2e_tables)
        if quix:
            # The two checkpoint sizes swap places each round, as the engine and the raw loops
            # do across rounds: neither always runs on the broker as the other left it.
            order = QUIX_COMMIT_EVERY if n % 2 else tuple(reversed(QUIX_COMMIT_EVERY))
            for every in order:
                peer = _quix(found, source, quix_sink, events, every, meter)
                sides[f"quix_{every}"] = {**_side(peer), "version": peer.note}
        before = sum(end_offsets(found.kafka, commands).values())
        engine_tables = box.schema(f"engine{n}")
        wal = boxcpu.wal_records(found.database_url)
        engine = run_engine(
            found, engine_tables, box.prefix, source, events, group=f"group{n}", meter=meter
        )
        engine["commands_delivered"] = sum(end_offsets(found.kafka, commands).values()) - before
        engine["wal_records"] = _wal(found, wal, events)
        sides["engine"] = engine
        box.settle(engine_tables)
        # The audit trail's cost: the same drain with `history.payload = off`.
        off_tables = box.schema(f"engineoff{n}")
        wal = boxcpu.wal_records(found.database_url)
        trail_off = run_engine(
            found,
            off_tables,
            box.prefix,
            source,
            events,
            group=f"groupoff{n}",
            history_payload="off",
            meter=meter,
        )
        trail_off["wal_records"] = _wal(found, wal, events)
        sides["engine_trail_off"] = trail_off
        box.settle(off_tables)
        engine["history_bytes_per_event"] = _history_bytes(found, engine_tables) / events
        trail_off["history_bytes_per_event"] = _history_bytes(found, off_tables) / events
        if framed is not None:
            js_tables = box.schema(f"enginejs{n}")
            sides["engine_json_schema"] = run_engine(
                found,
                js_tables,
                framed.prefix,
                framed.source,
                events,
                group=f"groupjs{n}",
                meter=meter,
                schema_registry=framed.settings,
            )
            box.settle(js_tables)
        rate = engine["events_per_s"]
        ratios = {
            "raw_e2e": rate / e2e.rate,
            "min_raw_kafka_sql": rate / min(kafka.rate, sql.rate),
        }
        for every in QUIX_COMMIT_EVERY if quix else ():
            ratios[f"quix_{every}"] = rate / sides[f"quix_{every}"]["events_per_s"]
        if "engine_json_schema" in sides:
            # Reported, not a goal: the registry's framing against our JSON, same events.
            ratios["json_schema_vs_json"] = sides["engine_json_schema"]["events_per_s"] / rate
        raw = sides["raw_e2e"]
        costs = {
            "processor_vs_raw_e2e": engine["cpu_us"] / raw["cpu_us"],
            "box_vs_raw_e2e": (
                engine["box_us"] / raw["box_us"]
                if engine.get("box_us") and raw.get("box_us")
                else None
            ),
        }
        say(
            f"round {n}: events/s (processor / box CPU us/event): "
            + ", ".join(
                f"{k} {v['events_per_s']:,.0f} ({v['cpu_us']:.0f} / {_us(v.get('box_us'))})"
                for k, v in sides.items()
            )
            + f"; engine peak RSS {engine['peak_rss_mb']:.0f} MB; engine ratio to "
            + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
            + "; WAL records/event raw_e2e "
            + f"{_n(raw.get('wal_records'))}, engine {_n(engine.get('wal_records'))}"
        )
        rounds.append({**sides, "ratios": ratios, "costs": costs})

    profile = profile_stats = None
    if options.profile:
        say("profiled engine run (cProfile of the batch step, commit and relay; not timed)")
        profiled = run_engine(
            found,
            box.schema("profiled"),
            box.prefix,
            source,
            events,
            group="profiled",
            profile=True,
        )
        profile = profiled.pop("profile", None)
        profile_stats = profiled.pop("profile_stats", None)
    medians = {
        side: {key: _median(rounds, side, key) for key in _MEDIANS if key in rounds[0][side]}
        for side in _NAMES
        if side in rounds[0]
    }
    medians["engine"]["peak_rss_mb"] = _median(rounds, "engine", "peak_rss_mb")
    ratio = {
        k: float(statistics.median(r["ratios"][k] for r in rounds)) for k in rounds[0]["ratios"]
    }
    goals: dict[str, dict[str, Any]] = {
        k: {
            "at_least": GOALS[k],
            "median": ratio[k],
            "passed": ratio[k] >= GOALS[k],
            "rounds": [r["ratios"][k] for r in rounds],
        }
        for k in ratio
        if k in GOALS
    }
    cost = {
        k: float(statistics.median(vs))
        if (vs := [r["costs"][k] for r in rounds if r["costs"][k]])
        else None
        for k in rounds[0]["costs"]
    }
    for key, limit in COST_GOALS.items():
        value = cost.get(key)
        if value is not None:
            goals[key] = {
                "at_most": limit,
                "median": value,
                "passed": value <= limit,
                "rounds": [r["costs"][key] for r in rounds],
            }
    for key, limit in CEILINGS.items():
        value = medians["engine"].get(key)
        if value is not None:
            goals[key] = {
                "at_most": limit,
                "median": value,
                "passed": value <= limit,
                "rounds": [r["engine"].get(key) for r in rounds],
            }
    complete = all(r["engine"]["commands_delivered"] == events for r in rounds)
    return {
        "events": events,
        "partitions": PARTITIONS,
        "batch_size": BATCH_SIZE,
        "quix_version": rounds[0][f"quix_{QUIX_COMMIT_EVERY[0]}"]["version"] if quix else None,
        "quix_commit_every": list(QUIX_COMMIT_EVERY) if quix else [],
        "box_meter": meter.to_json(),
        "rounds": rounds,
        "median": medians,
        "ratio": ratio,
        "cost": cost,
        "engine_phases_us": rounds[-1]["engine"]["time_per_event_us"],
        "commands_complete": complete,
        "goals": goals,
        "profile": profile,
        "profile_stats": profile_stats,
    }


@dataclass(frozen=True)
class _Framed:
    """The same backlog, framed for a Schema Registry (JSON Schema), under its own prefix."""

    prefix: str
    source: str
    settings: Mapping[str, Any]


def _framed(found: Services, box: Scratch, events: int) -> _Framed | None:
    """Preloads the framed backlog; None (with a line saying why) without a registry."""
    if not found.schema_registry:
        say("JSON Schema side skipped: no Schema Registry (set SAGA_TEST_SCHEMA_REGISTRY_URL)")
        return None
    from processor._bootstrap.schemas import registry_client
    from processor._schemas.codec import writer_schema
    from processor._schemas.formats import SubjectNaming, WireFormat
    from processor.settings import SchemaRegistrySettings

    prefix = f"{box.prefix}js."
    created = [
        box.topic(f"js.{t}", p)
        for t, p in (
            (TRANSFER_EVENTS_TOPIC, PARTITIONS),
            (ACCOUNT_COMMANDS_TOPIC, PARTITIONS),
            ("saga-dead-letters", 1),
        )
    ]
    config = {"url": found.schema_registry, "topics": {TRANSFER_EVENTS_TOPIC: "json-schema"}}
    sr = SchemaRegistrySettings.model_validate(config)
    writer = writer_schema(
        registry.of(TransferRequested), created[0], WireFormat.JSON_SCHEMA, sr.subject_naming
    )
    assert sr.subject_naming is SubjectNaming.TOPIC_RECORD
    client = registry_client(sr)
    try:
        schema_id = client.register(writer)
    finally:
        client.close()
    say(f"JSON Schema side: {writer.subject} registered as schema id {schema_id}")
    preload(found.kafka, created[0], events, f"{box.run_id}js", schema_id)
    return _Framed(prefix, created[0], config)


def _wal(found: Services, before: float | None, events: int) -> float | None:
    """WAL records per event since ``before``: read once the side's connections closed, when
    their backends have added every record to ``pg_stat_wal`` (see benchmarks/boxcpu.py)."""
    after = boxcpu.wal_records(found.database_url)
    return (after - before) / events if after is not None and before is not None else None


def _history_bytes(found: Services, tables: Tables) -> float:
    """Size of the history table (with its indexes and TOAST) in the run's schema."""
    import psycopg

    schema = tables.schema
    with psycopg.connect(found.database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_total_relation_size(format('%%I.saga_history', %s::text))", (schema,)
        ).fetchone()
    return float(row[0]) if row else 0.0


_MEDIANS = (
    "events_per_s",
    "cpu_us",
    "processor_us",
    "postgres_us",
    "kafka_us",
    "box_us",
    "wal_records",
)


def _median(rounds: list[dict[str, Any]], side: str, key: str) -> float | None:
    """The median over the rounds; None when a part was not read (a server elsewhere)."""
    values = [r[side][key] for r in rounds if r[side].get(key) is not None]
    return float(statistics.median(values)) if values else None


def _us(value: float | None) -> str:
    return f"{value:.0f}" if value is not None else "n/a"


def _n(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "n/a"


_NAMES = {
    "raw_kafka": "raw Kafka loop",
    "raw_sql": "raw SQL loop",
    "raw_e2e": "raw end-to-end loop",
    **{f"quix_{n}": f"Quix Streams exactly-once, commit_every={n}" for n in QUIX_COMMIT_EVERY},
    "engine": "engine drain",
    "engine_trail_off": "engine drain, history.payload=off",
    "engine_json_schema": "engine drain, events framed for a Schema Registry (JSON Schema)",
}

_GOAL_NAMES = {
    "raw_e2e": "engine / raw_e2e",
    "min_raw_kafka_sql": "engine / min_raw_kafka_sql",
    "quix_500": "engine / Quix (commit_every=500)",
    "processor_vs_raw_e2e": "engine processor CPU / raw_e2e's",
    "wal_records": "engine WAL records/event",
    "peak_rss_mb": "engine peak RSS MB",
}


_TENTHS = ("wal_records",)


def summary(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = [
        (
            "S1",
            _NAMES[side],
            f"{m['events_per_s']:,.0f} events/s; CPU us/event: processor "
            f"{_us(m.get('processor_us', m['cpu_us']))}, postgres {_us(m.get('postgres_us'))}, "
            f"kafka {_us(m.get('kafka_us'))}, box {_us(m.get('box_us'))}; "
            f"WAL records/event {_n(m.get('wal_records'))}",
        )
        for side, m in result["median"].items()
    ]
    if not result.get("quix_commit_every"):
        rows.append(("S1", "Quix Streams", "skipped: no .venv-bench (make bench installs it)"))
    last = result["rounds"][-1]
    engine = result["median"]["engine"]
    if engine.get("peak_rss_mb") is not None:
        rows.append(
            (
                "S1",
                "engine peak RSS during the drain",
                f"{engine['peak_rss_mb']:.0f} MB (median; the process held "
                f"{last['engine']['rss_at_start_mb']:.0f} MB at the start, last round)",
            )
        )
    if "engine_trail_off" in last:
        rows.append(
            (
                "S1",
                "audit trail (full vs off)",
                f"history {last['engine']['history_bytes_per_event']:,.0f} vs "
                f"{last['engine_trail_off']['history_bytes_per_event']:,.0f} bytes/event; "
                f"{last['engine']['events_per_s']:,.0f} vs "
                f"{last['engine_trail_off']['events_per_s']:,.0f} events/s",
            )
        )
    if "json_schema_vs_json" in result["ratio"]:
        rows.append(
            (
                "S1",
                "JSON Schema framing vs our JSON",
                f"{result['ratio']['json_schema_vs_json']:.2f}x the events/s (median of rounds)",
            )
        )
    phases = result["engine_phases_us"]
    rows.append(
        (
            "S1",
            "engine CPU us/event by phase",
            ", ".join(f"{k} {v['cpu_us']:.0f}" for k, v in phases.items()),
        )
    )
    # Wall time shows which stage the others wait for: the commit (the database's side of the
    # write) when it is close to the time per event.
    rows.append(
        (
            "S1",
            "engine wall us/event by phase",
            ", ".join(f"{k} {v['wall_us']:.0f}" for k, v in phases.items())
            + f"; {1e6 / last['engine']['events_per_s']:.0f} per event overall (last round)",
        )
    )
    for key, goal in result["goals"].items():
        # Each round's value beside the median: on a shared machine one noisy round shows.
        # Ratios to two decimals, microseconds and megabytes whole.
        digits = 2 if "at_least" in goal or key in COST_GOALS else 1 if key in _TENTHS else 0
        spread = " ".join(f"{v:.{digits}f}" if v is not None else "n/a" for v in goal["rounds"])
        if "at_least" in goal:
            bound, verdict = f">= {goal['at_least']}", "PASS" if goal["passed"] else "BELOW"
        else:
            bound = f"<= {goal['at_most']:.{min(digits, 1)}f}"
            verdict = "PASS" if goal["passed"] else "ABOVE"
        beside = ""
        if key == "quix_500" and "quix_2000" in result["ratio"]:
            beside = f"; at commit_every=2000: {result['ratio']['quix_2000']:.2f}"
        rows.append(
            (
                "S1",
                _GOAL_NAMES.get(key, key),
                f"{goal['median']:.{digits}f} (goal {bound}: {verdict}){beside}; rounds {spread}",
            )
        )
    box = result.get("cost", {}).get("box_vs_raw_e2e")
    if box is not None:
        rows.append(("S1", "engine whole-box CPU / raw_e2e's", f"{box:.2f} (median)"))
    if not result["commands_complete"]:
        rows.append(("S1", "commands delivered", "INCOMPLETE: see the JSON report"))
    return rows
