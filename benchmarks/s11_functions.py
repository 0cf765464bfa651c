"""S11, saga functions: the trip saga as one function against the same saga as orchestrated steps.

The backlog of N trips waits in each side's trip events topic (6 partitions, keyed by trip id,
the sagas' association value): per trip its start event (``BookTrip`` for the orchestrated
``TripSaga``, ``TripRequested`` for ``trip_function``) and the three replies its calls expect,
``FlightReserved``, ``HotelReserved`` and ``TripCharged``, published beforehand. A saga takes its
events in log order per key, so no participant is needed: each reply resolves the call in
flight, and the saga ends COMPLETED. The backlog is published in waves (every trip's start, then
every trip's first reply, ...), so a saga's events fall in different batches and each reply
loads the saga's row and stores it again, as replies that come later than their command do.

One processor (in-process, as S1 runs it) with only the side's saga drains the backlog, timed
from partition assignment until the stored offsets reach the end offsets and the outbox is empty
(3 commands per trip relayed), on a schema and consumer group of its own per round; every saga
is then counted COMPLETED. The sides alternate round by round. The function side resumes each
function from the replica's cache of suspended functions (``saga_functions.cache_size``); its
hits are counted, and one more function round with ``cache_size = 0`` replays each function
from its start against its journal at every reply. Issue 49's goal: the function side at least
0.7x the orchestrated side's events/s (median of the rounds' ratios), with the cache.

Beside it, in process (``benchmarks.fn_replay``): what a cache miss costs at journals of 10 and
50 awaits. And a cProfile of a function round (the batch step, commit and relay, as S1's) and
of an orchestrated one, kept beside the report. The profiles do not show the garbage
collector's time, which the functions held in the cache add to (every full collection walks
them): each drain reports the collector's runs by generation beside its rate.
"""

from __future__ import annotations

import gc
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from confluent_kafka import Producer

from benchmarks import fn_replay, raw_limits, s1_backlog
from benchmarks.boxcpu import Meter
from benchmarks.common import Scratch, Services, alternating, kafka_config, say
from processor import Message
from processor._authoring.functions import CACHE_SIZE, function_spec
from processor._authoring.messages import (
    HEADER_CORRELATION_ID,
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_OCCURRED_AT,
    HEADER_SCHEMA_VERSION,
    registry,
)
from processor._postgres.connect import connect
from processor._postgres.schema.tables import Tables
from sagas.trip import TripSaga
from sagas.trip_function import trip_function
from schemas import trips
from schemas.orders import ESCALATIONS_TOPIC

DEFAULT_TRIPS = 5_000
QUICK_TRIPS = 750
PARTITIONS = s1_backlog.PARTITIONS
EVENTS_PER_TRIP = 4
REPLIES = (trips.FlightReserved, trips.HotelReserved, trips.TripCharged)
GOAL = 0.7
SIDES = ("orchestrated", "function")


@dataclass(frozen=True)
class Options:
    trips: int
    rounds: int = 3
    profile: bool = True
    replay_round: bool = True
    micro: bool = True
    quick: bool = False

    @classmethod
    def of(
        cls, *, quick: bool, trips: int | None, rounds: int | None, profile: bool = True
    ) -> Options:
        return cls(
            trips=trips or (QUICK_TRIPS if quick else DEFAULT_TRIPS),
            rounds=rounds or (1 if quick else 3),
            profile=profile,
            quick=quick,
        )


@dataclass(frozen=True)
class _Side:
    """One side's saga, its start event, and its topics: the run's, under ``sub`` of its own."""

    name: str
    saga: type[Any]
    start: type[trips.BookTrip]
    sub: str


def backlog(start: type[trips.BookTrip], run_id: str, count: int) -> list[Message]:
    """A backlog in publishing order: a wave of starts, then a wave of each reply."""
    ids = [f"trip-{run_id}-{i:07d}" for i in range(count)]
    out: list[Message] = [
        start(
            trip_id=t,
            traveller_id=f"tv-{i % 1000}",
            flight=f"FL{i % 97}",
            hotel=f"H{i % 89}",
            amount=Decimal("420.00"),
        )
        for i, t in enumerate(ids)
    ]
    for reply in REPLIES:
        out.extend(reply(trip_id=t) for t in ids)
    return out


def preload(kafka: str, topic: str, messages: list[Message]) -> None:
    """Publishes ``messages`` as upstream services would: key = trip id, full headers."""
    producer = Producer({**kafka_config(kafka), "linger.ms": 20, "enable.idempotence": True})
    failed: list[Any] = []
    t0 = time.monotonic()
    for i, message in enumerate(messages):
        mtype = registry.of(type(message))
        trip_id = str(getattr(message, "trip_id"))  # noqa: B009 (every trip message has one)
        headers = [
            (HEADER_MESSAGE_ID, str(uuid.uuid4()).encode()),
            (HEADER_MESSAGE_TYPE, mtype.name.encode()),
            (HEADER_SCHEMA_VERSION, str(mtype.version).encode()),
            (HEADER_CORRELATION_ID, trip_id.encode()),
            (HEADER_OCCURRED_AT, datetime.now(UTC).isoformat().encode()),
        ]
        raw_limits.produce(
            producer,
            topic,
            key=trip_id.encode(),
            value=message.model_dump_json().encode(),
            headers=headers,
            on_delivery=lambda err, _m: failed.append(err) if err else None,
        )
        if i % 5000 == 4999:
            producer.poll(0)
    if producer.flush(60) or failed:
        raise RuntimeError(f"preload failed: {failed[:1]}")
    say(f"  preloaded {len(messages)} events to {topic} in {time.monotonic() - t0:.1f} s")


def _cache() -> Any:
    spec = function_spec(trip_function)
    assert spec is not None
    return spec.suspended


def _collections() -> list[int]:
    """The garbage collector's collections so far, by generation."""
    return [int(g["collections"]) for g in gc.get_stats()]


def _outcomes(found: Services, tables: Tables) -> tuple[dict[str, int], float]:
    """Sagas by status and outcome (``ended/COMPLETED``), and the mean stored state's bytes."""
    by = tables.render(
        "SELECT status || '/' || coalesce(machine_state, ''), count(*),"
        " sum(octet_length(state::text)) FROM {instance} GROUP BY 1"
    )
    with connect(found.database_url, autocommit=True) as conn:
        rows = conn.execute(by).fetchall()
    counts = {str(r[0]): int(r[1]) for r in rows}
    total = sum(counts.values())
    size = sum(int(r[2] or 0) for r in rows) / total if total else 0.0
    return counts, size


def _drain(
    found: Services,
    box: Scratch,
    side: _Side,
    options: Options,
    label: str,
    meter: Meter | None,
    *,
    cache_size: int | None = None,
    profile: bool = False,
) -> dict[str, Any]:
    """One timed drain of the side's backlog on a schema and group of its own."""
    tables = box.schema(label)
    events = options.trips * EVENTS_PER_TRIP
    cache = _cache()
    hits, replays = cache.hits, cache.replays
    collections = _collections()
    result = s1_backlog.run_engine(
        found,
        tables,
        box.prefix + side.sub,
        box.prefix + side.sub + trips.TRIP_EVENTS_TOPIC,
        events,
        group=label,
        meter=meter,
        profile=profile,
        sagas=(side.saga,),
        handler_settings={CACHE_SIZE: cache_size} if cache_size is not None else None,
    )
    # The garbage collector's runs during the drain (the whole process's; cProfile does not
    # show their time): a held function keeps objects alive that every full collection walks.
    result["gc_collections"] = [a - b for a, b in zip(_collections(), collections, strict=True)]
    counts, state_bytes = _outcomes(found, tables)
    completed = counts.get("ended/COMPLETED", 0)
    if completed != options.trips:
        raise RuntimeError(
            f"{side.name} ({label}): {completed} of {options.trips} trips COMPLETED: {counts}"
        )
    result["sagas"] = counts
    result["state_bytes"] = state_bytes
    if side.name == "function":
        result["cache_hits"] = cache.hits - hits
        result["cache_replays"] = cache.replays - replays
        result["cache_left"] = len(cache)
    box.settle(tables)
    return result


def _round(side: _Side) -> Callable[..., dict[str, Any]]:
    def one(
        found: Services, box: Scratch, options: Options, meter: Meter, n: int
    ) -> dict[str, Any]:
        got = _drain(found, box, side, options, f"{side.name[:4]}{n}", meter)
        extra = ""
        if side.name == "function":
            extra = f", cache hits {got['cache_hits']}, replays {got['cache_replays']}"
        say(
            f"  {side.name}: {got['events_per_s']:,.0f} events/s, "
            f"{got['cpu_us']:.0f} us CPU/event (processor), gc collections by generation "
            f"{got['gc_collections']}{extra}"
        )
        return got

    return one


def run(found: Services, box: Scratch, options: Options) -> dict[str, Any]:
    events = options.trips * EVENTS_PER_TRIP
    say(
        f"S11 saga functions: {options.trips} trips ({events} events) over {PARTITIONS} "
        f"partitions, {options.rounds} alternating round(s) of the orchestrated trip saga and "
        "the trip saga as a function"
    )
    meter = Meter.find(found.kafka, found.database_url)
    sides = {
        "orchestrated": _Side("orchestrated", TripSaga, trips.BookTrip, "orch."),
        "function": _Side("function", trip_function, trips.TripRequested, "fn."),
    }
    for side in sides.values():
        source = box.topic(side.sub + trips.TRIP_EVENTS_TOPIC, PARTITIONS)
        box.topic(side.sub + trips.TRIP_COMMANDS_TOPIC, PARTITIONS)
        box.topic(side.sub + ESCALATIONS_TOPIC, 1)
        box.topic(side.sub + "saga-dead-letters", 1)
        preload(found.kafka, source, backlog(side.start, box.run_id, options.trips))
    box.settle()

    rounds: list[dict[str, Any]] = []
    runs = {name: _round(sides[name]) for name in SIDES}
    for n, got in alternating(runs, options.rounds, found, box, options, meter):
        ratio = got["function"]["events_per_s"] / got["orchestrated"]["events_per_s"]
        say(f"round {n}: function / orchestrated {ratio:.2f}")
        rounds.append({**got, "ratio": ratio})

    replay_always = None
    if options.replay_round:
        say("function round with saga_functions.cache_size = 0 (every reply replays)")
        replay_always = _drain(
            found, box, sides["function"], options, "fnreplay", meter, cache_size=0
        )
        say(
            f"  replay always: {replay_always['events_per_s']:,.0f} events/s, "
            f"hits {replay_always['cache_hits']}, replays {replay_always['cache_replays']}"
        )

    profiles: dict[str, Any] = {}
    if options.profile:
        say("profiled drains (cProfile of the batch step, commit and relay; not timed)")
        for name in reversed(SIDES):
            profiled = _drain(
                found, box, sides[name], options, f"{name[:4]}prof", None, profile=True
            )
            profiles[name] = {
                "profile": profiled.pop("profile", None),
                "profile_stats": profiled.pop("profile_stats", None),
            }

    micro: dict[str, Any] = {}
    if options.micro:
        say("replay cost in process (benchmarks/fn_replay.py): journals of 10 and 50 awaits")
        micro = fn_replay.measure_all(quick=options.quick)
        for depth, m in micro.items():
            say(
                f"  {depth} awaits: replay {m['replay_us']:.0f} us ({m['replay_per_await_us']:.1f}"
                f" per await), resume {m['resume_us']:.0f} us: a miss adds {m['miss_us']:.0f} us"
            )

    medians = {
        name: {
            key: statistics.median(r[name][key] for r in rounds)
            for key in ("events_per_s", "cpu_us", "processor_us", "box_us", "state_bytes")
            if all(r[name].get(key) is not None for r in rounds)
        }
        for name in SIDES
    }
    ratio = float(statistics.median(r["ratio"] for r in rounds))
    fn_rounds = [r["function"] for r in rounds]
    resolutions = options.trips * len(REPLIES) * len(rounds)
    return {
        "trips": options.trips,
        "events": events,
        "partitions": PARTITIONS,
        "batch_size": s1_backlog.BATCH_SIZE,
        "box_meter": meter.to_json(),
        "rounds": rounds,
        "median": medians,
        "ratio": ratio,
        "cache": {
            "hits": sum(f["cache_hits"] for f in fn_rounds),
            "replays": sum(f["cache_replays"] for f in fn_rounds),
            "resolutions": resolutions,
            "left": fn_rounds[-1]["cache_left"],
        },
        "replay_always": replay_always,
        "goal": {
            "at_least": GOAL,
            "median": ratio,
            "passed": ratio >= GOAL,
            "rounds": [r["ratio"] for r in rounds],
        },
        "replay_cost": micro,
        "profiles": profiles,
    }


def summary(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    names = {
        "orchestrated": "orchestrated trip saga",
        "function": "trip saga as a function (cache)",
    }
    for name in SIDES:
        m = result["median"][name]
        box = f", box {m['box_us']:.0f}" if m.get("box_us") is not None else ""
        last = result.get("rounds", [{}])[-1].get(name, {})
        collections = last.get("gc_collections")
        gcs = f"; gc runs {'/'.join(map(str, collections))} (last round)" if collections else ""
        rows.append(
            (
                "S11",
                names[name],
                f"{m['events_per_s']:,.0f} events/s; CPU us/event: processor "
                f"{m.get('processor_us', m['cpu_us']):.0f}{box}; state "
                f"{m['state_bytes']:,.0f} bytes/saga{gcs}",
            )
        )
    goal = result["goal"]
    spread = " ".join(f"{v:.2f}" for v in goal["rounds"])
    verdict = "PASS" if goal["passed"] else "BELOW"
    rows.append(
        (
            "S11",
            "function / orchestrated",
            f"{goal['median']:.2f} (goal >= {goal['at_least']}: {verdict}); rounds {spread}",
        )
    )
    c = result["cache"]
    rows.append(
        (
            "S11",
            "function cache",
            f"{c['hits']} hits, {c['replays']} replays of {c['resolutions']} resolutions",
        )
    )
    always = result.get("replay_always")
    if always:
        fn = result["median"]["function"]["events_per_s"]
        rows.append(
            (
                "S11",
                "function, cache_size=0 (replay always)",
                f"{always['events_per_s']:,.0f} events/s ({always['events_per_s'] / fn:.2f}x the"
                f" cached median); {always['cache_replays']} replays",
            )
        )
    for depth, m in result.get("replay_cost", {}).items():
        rows.append(
            (
                "S11",
                f"handler step at {depth} awaits",
                f"replay {m['replay_us']:.0f} us ({m['replay_per_await_us']:.1f}/await), resume "
                f"{m['resume_us']:.0f} us: a miss adds {m['miss_us']:.0f} us "
                f"({m['miss_per_await_us']:.1f}/await); row {m['state_bytes']:,} bytes, load "
                f"{m['load_us']:.0f} us, dump {m['dump_us']:.0f} us",
            )
        )
    return rows
