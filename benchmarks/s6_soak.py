"""S6, soak with retention: sagas start and end for a long time; throughput and tables stay flat.

The engine's planner and PostgreSQL batch store write batches as the consumer does (in this
process, no broker: the soak is about the database), each batch starting some sagas, moving
others on and ending others, while the retention loop purges beside it with periods of seconds
instead of days. Every window the throughput and each table's rows and size are sampled.

Reported: throughput per window and its drift (the last third of the windows against the first
third, the warm-up window left out), and each table's rows and size at the end against their
peak in the first half of the steady state (after the first dedupe window). Goals: drift within
20 %, and no table's rows or size at the end above 1.5 times that peak (retention keeps them
bounded). A quick run is too short for sizes to settle; read its goal as a smoke test.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from benchmarks.common import Scratch, Services, say
from processor import Message, SagaState, message_type, saga, saga_event_handler
from processor._authoring.messages import MessageRegistry
from processor._engine.decode import decode
from processor._engine.plan import Planner
from processor._engine.records import OffsetCommit, Record
from processor._invocation import bind_all
from processor._postgres.batch.handle import PostgresBatchStore
from processor._postgres.connect import connect
from processor._postgres.retention import PostgresRetentionStore
from processor._postgres.schema.tables import Tables
from processor._runtime.retention import Retention
from processor.settings import RetentionSettings

REG = MessageRegistry()
TOPIC = "s6-in"
SAGAS_PER_BATCH = 200  # each batch: 200 starts, 200 steps, 200 ends (600 events)
TABLES = ("instance", "history", "tombstone")
GOAL_DRIFT = 0.2
GOAL_GROWTH = 1.5


@message_type("s6.Opened", registry=REG)
class Opened(Message):
    order_id: str


@message_type("s6.Stepped", registry=REG)
class Stepped(Message):
    order_id: str


@message_type("s6.Closed", registry=REG)
class Closed(Message):
    order_id: str


@saga(type="s6-order")
class Order(SagaState):
    order_id: str = ""
    steps: int = 0

    @saga_event_handler(Opened, association_property="order_id", start=True)
    def opened(self, event: Opened) -> None:
        self.order_id = event.order_id

    @saga_event_handler(Stepped, association_property="order_id")
    def stepped(self, event: Stepped) -> None:
        self.steps += 1

    @saga_event_handler(Closed, association_property="order_id", end=True)
    def closed(self, event: Closed) -> None:
        """Ends the saga."""


@dataclass(frozen=True)
class Options:
    seconds: int = 600
    windows: int = 10

    @classmethod
    def of(cls, *, quick: bool, seconds: int | None) -> Options:
        return cls(seconds=seconds or (45 if quick else 600))


def retention_settings(seconds: int) -> RetentionSettings:
    """Periods scaled to the soak: a saga is purged a few windows after it ended."""
    period = max(2.0, seconds / 40)
    return RetentionSettings(
        ended_sagas=period,
        history=period,
        dedupe_window=2 * period,
        dead_letters=period,
        parked_messages=period,
        failed_outbox=period,
        chunk_size=1000,
        chunk_pause=0.01,
        interval=max(0.5, period / 4),
    )


def _record(offset: int, message: Opened | Stepped | Closed, message_id: str) -> Record:
    headers = (
        ("message-id", message_id.encode()),
        ("message-type", REG.of(type(message)).name.encode()),
        ("schema-version", b"1"),
    )
    value = message.model_dump_json().encode()
    return Record(TOPIC, 0, offset, message.order_id.encode(), value, headers)


def _sizes(conn: psycopg.Connection[Any], tables: Tables) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name in TABLES:
        q = tables.render(f"SELECT count(*), pg_total_relation_size('{{{name}}}') FROM {{{name}}}")
        row = conn.execute(q).fetchone()
        assert row is not None
        out[name] = {"rows": int(row[0]), "bytes": int(row[1])}
    return out


def run(found: Services, box: Scratch, options: Options) -> dict[str, Any]:
    settings = retention_settings(options.seconds)
    say(
        f"S6 soak: {options.seconds} s of sagas starting and ending, retention every "
        f"{settings.interval.total_seconds():.1f} s (ended sagas and history after "
        f"{settings.ended_sagas.total_seconds():.0f} s)"
    )
    tables = box.schema("soak")
    url = found.database_url
    planner = Planner(bind_all([Order], registry=REG), registry=REG, dead_letter_topic="dl")
    store = PostgresBatchStore(lambda: connect(url), tables, "s6")
    retention = Retention(PostgresRetentionStore(lambda: connect(url), tables), settings)
    stop = threading.Event()
    loop = threading.Thread(target=retention.run, args=(stop,), name="retention", daemon=True)
    epoch = store.claim([(TOPIC, 0)], "s6")[(TOPIC, 0)][0]
    offset, expected, started, next_id = 0, None, 0, 0
    # Sagas in flight: started ones take a step in the next batch and end in the one after.
    opened: list[str] = []
    stepped: list[str] = []
    window = options.seconds / options.windows
    samples: list[dict[str, Any]] = []
    loop.start()
    t0 = time.monotonic()
    mark, ended_at_mark = t0, 0
    ended = 0
    with psycopg.connect(url, autocommit=True) as probe:
        try:
            while (now := time.monotonic()) - t0 < options.seconds:
                ids = [f"o{n}" for n in range(next_id, next_id + SAGAS_PER_BATCH)]
                next_id += SAGAS_PER_BATCH
                messages: list[tuple[Opened | Stepped | Closed, str]] = [
                    (Closed(order_id=i), f"{i}-c") for i in stepped
                ]
                messages += [(Stepped(order_id=i), f"{i}-s") for i in opened]
                messages += [(Opened(order_id=i), f"{i}-o") for i in ids]
                records = [_record(offset + k, m, mid) for k, (m, mid) in enumerate(messages)]
                offset += len(records)
                items, wants = planner.route(decode(r, REG, 1 << 20) for r in records)
                loaded = store.load(wants)
                ws = planner.plan(items, loaded, loaded.now)
                store.write(ws, [OffsetCommit(TOPIC, 0, offset, expected, epoch)])
                expected = offset
                ended += ws.counts["ended"]
                started += len(ids)
                stepped, opened = opened, ids
                if now - mark >= window:
                    rate = (ended - ended_at_mark) / (now - mark)
                    sample: dict[str, Any] = {"at_s": now - t0, "sagas_per_s": rate}
                    sample.update(_sizes(probe, tables))
                    samples.append(sample)
                    say(
                        f"  {sample['at_s']:5.0f} s: {rate:7.0f} sagas/s; rows "
                        + ", ".join(f"{n} {sample[n]['rows']}" for n in TABLES)
                    )
                    mark, ended_at_mark = now, ended
        finally:
            stop.set()
            loop.join(10)
            store.close()
    return _result(options, settings, samples, started, ended, dict(retention.deleted))


def _result(
    options: Options,
    settings: RetentionSettings,
    samples: list[dict[str, Any]],
    started: int,
    ended: int,
    deleted: dict[Any, int],
) -> dict[str, Any]:
    # The first window warms up (caches, plans, empty tables); drift compares the mean of the
    # last third of the windows with that of the first third after it.
    rates = [s["sagas_per_s"] for s in samples[1:]]
    third = max(1, len(rates) // 3)
    early, late = rates[:third], rates[-third:]
    drift = sum(late) / sum(early) - 1.0 if early and sum(early) > 0 else float("nan")
    # Steady state begins once the first dedupe window has passed: before it nothing expires.
    settle = settings.dedupe_window.total_seconds() + settings.interval.total_seconds()
    steady = [s for s in samples if s["at_s"] >= settle] or samples[-1:]
    growth: dict[str, dict[str, float]] = {}
    for name in TABLES:
        growth[name] = {}
        for unit in ("rows", "bytes"):
            peak = max(s[name][unit] for s in steady[: max(1, len(steady) // 2)])
            growth[name][unit] = steady[-1][name][unit] / peak if peak else 0.0
    passed_drift = abs(drift) <= GOAL_DRIFT
    passed_growth = all(g[u] <= GOAL_GROWTH for g in growth.values() for u in g)
    return {
        "seconds": options.seconds,
        "retention": settings.model_dump(mode="json"),
        "sagas_started": started,
        "sagas_ended": ended,
        "deleted": {str(k): v for k, v in deleted.items()},
        "samples": samples,
        "throughput_drift": drift,
        "size_growth": growth,
        "goal": {
            "drift_within": GOAL_DRIFT,
            "growth_at_most": GOAL_GROWTH,
            "passed": passed_drift and passed_growth,
        },
    }


def summary(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    g = result["goal"]
    last = result["samples"][-1] if result["samples"] else {}
    rows = [
        (
            "S6",
            f"soak {result['seconds']} s: sagas ended",
            f"{result['sagas_ended']} ({result['sagas_ended'] / result['seconds']:.0f}/s)",
        ),
        (
            "S6",
            "throughput drift (late / early windows)",
            f"{result['throughput_drift']:+.1%} (goal within {g['drift_within']:.0%})",
        ),
    ]
    for name in TABLES:
        if name in last:
            rows.append(
                (
                    "S6",
                    f"{name} at the end",
                    f"{last[name]['rows']} rows, {last[name]['bytes'] // 1024} KiB, "
                    f"x{result['size_growth'][name]['rows']:.2f} rows, "
                    f"x{result['size_growth'][name]['bytes']:.2f} size of the steady peak",
                )
            )
    rows.append(("S6", "bounded and flat", "PASS" if g["passed"] else "BELOW"))
    return rows
