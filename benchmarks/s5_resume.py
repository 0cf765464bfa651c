"""S5, resume after failure: kill -9 one of two replicas under a steady load.

Two engine replicas (processes) share the input topic while events arrive at a steady rate. Once
the lag has been steady for a while, one replica is killed with SIGKILL. Measured from the kill:
the time until every partition it owned moves again (its stored offset advances) and the time
until the lag is back within the level seen before the kill. Then the load stops, the backlog
drains and the effects are counted: one applied history row and one saga per event sent (zero
lost, zero duplicated), outbox empty.

The same run measures a plain confluent-kafka consumer group (two processes, same session
timeout and assignment strategy, offsets auto-committed every 100 ms) killed the same way: the
time until the killed member's partitions are committed past where they stood. Rounds alternate
which of the two goes first, each on topics and tables of its own; the goal reads the median of
the rounds' ratios.
"""

from __future__ import annotations

import json
import math
import signal
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition

from benchmarks import s1_backlog
from benchmarks.common import RESULTS_DIR, Scratch, Services, alternating, kafka_config, say
from benchmarks.live import Child, Source, child_spec, engine_replica
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC

PARTITIONS = s1_backlog.PARTITIONS
SESSION_MS = 6000
GOAL_RATIO = 1.5


@dataclass(frozen=True)
class Options:
    rate: int = 500
    steady: float = 15.0
    rounds: int = 3

    @classmethod
    def of(cls, *, quick: bool, rounds: int | None = None) -> Options:
        if quick:
            return cls(rate=200, steady=4.0, rounds=rounds or 1)
        return cls(rounds=rounds or 3)


class _Ends:
    """High watermarks of the input topic, through one long-lived client."""

    def __init__(self, kafka: str, topic: str) -> None:
        self.topic = topic
        self.consumer = Consumer({**kafka_config(kafka), "group.id": f"bench-{uuid.uuid4().hex}"})

    def total(self) -> int:
        return sum(
            self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        )

    def close(self) -> None:
        self.consumer.close()


Positions = Callable[[], dict[int, int]]


def _resume(
    positions: Positions,
    ends: _Ends,
    killed: set[int],
    kill: Callable[[], None],
    rate: int,
    steady: float,
    gone: Callable[[], bool] = lambda: True,
) -> dict[str, Any]:
    """Samples the lag while steady, kills, then times the resume and the return to normal."""
    lags: list[int] = []
    end = time.monotonic() + steady
    while time.monotonic() < end:
        lags.append(ends.total() - sum(positions().values()))
        time.sleep(0.1)
    normal = max(lags) * 1.5 + rate * 0.25
    t_kill = time.monotonic()
    kill()
    # The positions it left are read once it is gone for good: a commit it sent just before
    # the kill can still land after it died, and would pass for its partitions' resumption.
    deadline = time.monotonic() + 10
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.01)
    at_kill = positions()
    resumed = back = None
    while time.monotonic() - t_kill < 90 and back is None:
        now_pos = positions()
        now = time.monotonic()
        if resumed is None and all(now_pos.get(p, 0) > at_kill.get(p, 0) for p in killed):
            resumed = now - t_kill
        if resumed is not None and ends.total() - sum(now_pos.values()) <= normal:
            back = now - t_kill
        time.sleep(0.05)
    return {
        "killed_partitions": sorted(killed),
        "steady_lag_max": max(lags) if lags else 0,
        "normal_lag_bound": normal,
        "resumed_s": resumed,
        "lag_normal_s": back,
    }


def _engine(found: Services, box: Scratch, options: Options, n: int) -> dict[str, Any]:
    # Topics of the round's own: a topic prefix per round.
    prefix = f"r{n}."
    source_topic = box.topic(prefix + TRANSFER_EVENTS_TOPIC, PARTITIONS)
    box.topic(prefix + ACCOUNT_COMMANDS_TOPIC, PARTITIONS)
    box.topic(prefix + "saga-dead-letters", 1)
    tables = box.schema(f"engine{n}")
    box.settle()
    base = s1_backlog.settings(found, tables, box.prefix + prefix)
    base = base.model_copy(
        update={
            "sagas": ["sagas.transfer:TransferSaga"],
            "consumer": base.consumer.model_copy(
                update={"session_timeout": timedelta(milliseconds=SESSION_MS)}
            ),
        }
    )
    group = base.consumer.group_id
    replicas = [
        engine_replica(f"s5-{name}", base.model_copy(update={"instance_id": name}))
        for name in ("replica-1", "replica-2")
    ]
    ends = _Ends(found.kafka, source_topic)
    source = Source(found.kafka, source_topic, options.rate, f"{box.run_id}e{n}")
    q = tables.render(
        "SELECT partition, coalesce(next_offset, 0), owner FROM {offsets} WHERE group_id = %s"
    )
    conn = psycopg.connect(found.database_url, autocommit=True)
    try:

        def rows() -> list[tuple[int, int, str]]:
            return [(int(p), int(n), str(o)) for p, n, o in conn.execute(q, (group,)).fetchall()]

        deadline = time.monotonic() + 60
        while len({o for _p, _n, o in rows()}) < 2 or len(rows()) < PARTITIONS:
            if time.monotonic() > deadline:
                raise RuntimeError("S5: the two replicas did not share the partitions")
            time.sleep(0.2)
        source.start()
        time.sleep(1.0)  # a first round of batches before the steady phase is sampled
        owners = rows()
        victim_owner = sorted({o for _p, _n, o in owners})[0]
        killed = {p for p, _n, o in owners if o == victim_owner}
        victim_name, victim = next(
            (
                (name, r)
                for name, r in zip(("replica-1", "replica-2"), replicas, strict=True)
                if name in victim_owner
            ),
            ("replica-1", replicas[0]),
        )

        def gone() -> bool:
            # Its sessions end once their backends see the socket closed (a COMMIT already
            # received completes first).
            left = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                (f"saga:{victim_name}",),
            ).fetchone()
            return left is not None and left[0] == 0

        result = _resume(
            lambda: {p: n for p, n, _o in rows()},
            ends,
            killed,
            victim.kill,
            options.rate,
            options.steady,
            gone,
        )
        source.stop()
        sent = source.count
        counts = tables.render(
            "SELECT (SELECT count(*) FROM {history} WHERE outcome = 'applied'),"
            " (SELECT count(DISTINCT (saga_id, message_id)) FROM {history}"
            "   WHERE outcome = 'applied'),"
            " (SELECT count(*) FROM {instance}), (SELECT count(*) FROM {outbox})"
        )
        drained = time.monotonic() + 60
        applied = distinct = sagas = outbox = 0
        while time.monotonic() < drained:
            row = conn.execute(counts).fetchone()
            assert row is not None
            applied, distinct, sagas, outbox = (int(x) for x in row)
            if applied >= sent and outbox == 0:
                break
            time.sleep(0.2)
        result.update(
            {
                "victim": victim_owner,
                "events_sent": sent,
                "history_applied": applied,
                "history_distinct": distinct,
                "sagas": sagas,
                "outbox_left": outbox,
                "lost": max(0, sent - distinct),
                "duplicated": applied - distinct + max(0, sagas - sent),
            }
        )
        say(
            f"  engine: resumed after {_s(result['resumed_s'])}, lag normal after "
            f"{_s(result['lag_normal_s'])}, lost {result['lost']}, "
            f"duplicated {result['duplicated']}"
        )
        return result
    finally:
        source.stop()
        for r in replicas:
            r.stop()
        ends.close()
        conn.close()


def _plain(found: Services, box: Scratch, options: Options, n: int) -> dict[str, Any]:
    topic = box.topic(f"plain-events-{n}", PARTITIONS)
    group = f"{box.prefix}plain{n}"
    files = [RESULTS_DIR / "logs" / f"plain-{box.run_id}-{n}-{m}.json" for m in (1, 2)]
    members = [
        Child(
            f"s5-plain{n}-{m}",
            [
                "-m",
                "benchmarks.s5_resume",
                child_spec(kafka=found.kafka, topic=topic, group=group, assigned=str(f)),
            ],
            {},
        )
        for m, f in enumerate(files, start=1)
    ]
    probe = Consumer({**kafka_config(found.kafka), "group.id": group})
    ends = _Ends(found.kafka, topic)
    source = Source(found.kafka, topic, options.rate, f"{box.run_id}p{n}")

    def positions() -> dict[int, int]:
        tps = probe.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
        return {tp.partition: max(tp.offset, 0) for tp in tps}

    def assigned(path: Path) -> set[int]:
        try:
            return set(json.loads(path.read_text()))
        except (OSError, ValueError):
            return set()

    try:
        deadline = time.monotonic() + 60
        while not all(assigned(f) for f in files):
            if time.monotonic() > deadline:
                raise RuntimeError("S5: the plain consumers did not share the partitions")
            time.sleep(0.1)
        source.start()
        time.sleep(1.0)
        killed = assigned(files[0])
        result = _resume(positions, ends, killed, members[0].kill, options.rate, options.steady)
        say(f"  plain group: resumed after {_s(result['resumed_s'])}")
        return result
    finally:
        source.stop()
        for m in members:
            m.stop()
        probe.close()
        ends.close()


def run(found: Services, box: Scratch, options: Options) -> dict[str, Any]:
    say(
        f"S5 resume: 2 members at {options.rate} events/s, kill -9 one; {options.rounds} "
        "round(s) of engine and plain group, alternating which goes first"
    )
    rounds: list[dict[str, Any]] = []
    sides = {"engine": _engine, "plain": _plain}
    for n, got in alternating(sides, options.rounds, found, box, options):
        engine, plain = got["engine"], got["plain"]
        ratio = (
            engine["resumed_s"] / plain["resumed_s"]
            if engine["resumed_s"] is not None and plain["resumed_s"]
            else float("inf")
        )
        say(f"round {n}: engine / plain resume {ratio:.2f}")
        rounds.append({"engine": engine, "plain": plain, "resume_ratio": ratio})
    ratio = statistics.median(r["resume_ratio"] for r in rounds)
    engines = [r["engine"] for r in rounds]
    return {
        "rate": options.rate,
        "session_timeout_ms": SESSION_MS,
        "rounds": rounds,
        "engine": {
            "resumed_s": _median(e["resumed_s"] for e in engines),
            "lag_normal_s": _median(e["lag_normal_s"] for e in engines),
            **{
                k: sum(e[k] for e in engines)
                for k in ("events_sent", "lost", "duplicated", "outbox_left")
            },
        },
        "plain": {"resumed_s": _median(r["plain"]["resumed_s"] for r in rounds)},
        "resume_ratio": ratio,
        "goal": {"ratio_at_most": GOAL_RATIO, "passed": ratio <= GOAL_RATIO},
    }


def _median(values: Iterable[float | None]) -> float | None:
    # A side that never resumed counts as slower than any that did.
    m = statistics.median(math.inf if v is None else v for v in values)
    return None if m == math.inf else m


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def summary(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    e, p, g = result["engine"], result["plain"], result["goal"]
    each = " ".join(f"{r['resume_ratio']:.2f}" for r in result["rounds"])
    return [
        ("S5", "engine resumed / lag normal", f"{_s(e['resumed_s'])} / {_s(e['lag_normal_s'])}"),
        ("S5", "plain consumer group resumed", _s(p["resumed_s"])),
        (
            "S5",
            "engine effects after kill -9",
            f"{e['events_sent']} sent, lost {e['lost']}, duplicated {e['duplicated']}, "
            f"outbox left {e['outbox_left']}",
        ),
        (
            "S5",
            "engine / plain resume",
            f"{result['resume_ratio']:.2f} (goal <= {g['ratio_at_most']}: "
            f"{'PASS' if g['passed'] else 'BELOW'}); rounds {each}",
        ),
    ]


def _plain_member(spec: dict[str, Any]) -> int:
    """A plain consumer group member: consume, auto-commit, write its assignment to a file."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    path = Path(spec["assigned"])
    mine: set[int] = set()

    def on_assign(_c: Any, parts: list[TopicPartition]) -> None:
        mine.update(tp.partition for tp in parts)
        path.write_text(json.dumps(sorted(mine)))

    def on_revoke(_c: Any, parts: list[TopicPartition]) -> None:
        mine.difference_update(tp.partition for tp in parts)
        path.write_text(json.dumps(sorted(mine)))

    consumer = Consumer(
        {
            **kafka_config(spec["kafka"]),
            "group.id": spec["group"],
            "auto.offset.reset": "latest",
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 100,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": SESSION_MS // 3,
            "partition.assignment.strategy": "cooperative-sticky",
        }
    )
    consumer.subscribe([spec["topic"]], on_assign=on_assign, on_revoke=on_revoke)
    try:
        while not stop.is_set():
            consumer.consume(num_messages=500, timeout=0.1)
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(_plain_member(json.loads(sys.argv[1])))
