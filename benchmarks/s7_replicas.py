"""S7, replicas: the same backlog on a 12-partition topic drained by 1, 2 and 3 replicas (1, 2
with --quick).

Each replica is a process of its own (a processor with the example transfer saga, as S1 runs
it in-process). Each publishes the outbox rows of the input partitions it owns, so relaying
scales with the replicas as consuming does. The clock runs from the moment every partition was
claimed until every record is committed and the outbox is empty. Reported per replica count:
events/s, and per replica the rows its relay published and the relay's share of the process's
CPU time (each replica writes its counts when it stops).

The replicas start together and consume only once the group has spread the partitions over
all of them (their ownership claims wait until then), so that the first one up does not drain
the backlog alone. On a machine with fewer cores than replicas plus the broker and the
database, more replicas cannot go faster; the numbers say how the work splits, not what a
cluster would reach.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from benchmarks import s1_backlog
from benchmarks.common import RESULTS_DIR, Scratch, Services, end_offsets, kafka_config, say
from benchmarks.live import Child, settings_env
from benchmarks.s3_relay import records
from processor._postgres.connect import connect
from processor._postgres.schema.tables import Tables
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC

PARTITIONS = 12
DEFAULT_EVENTS = 30_000
QUICK_EVENTS = 8_000
REPLICAS = (1, 2, 3)
# A quick run stops at two: each replica count costs a group formation, which dominates there.
QUICK_REPLICAS = (1, 2)


@dataclass(frozen=True)
class Options:
    events: int
    replicas: tuple[int, ...] = REPLICAS

    @classmethod
    def of(cls, *, quick: bool, events: int | None = None) -> Options:
        if quick:
            return cls(events or QUICK_EVENTS, QUICK_REPLICAS)
        return cls(events or DEFAULT_EVENTS)


def _start_together(
    found: Services, tables: Tables, group: str, source: str, replicas: int, gate: Path
) -> None:
    """Opens the gate with the partitions' offsets rows locked, so that no replica can claim
    (and consume) a partition until the group has spread them over every replica; a claim
    waits a few seconds and retries, with its partitions paused."""
    rows = tables.render(
        "INSERT INTO {offsets} (group_id, topic, partition, next_offset, owner_epoch)"
        " SELECT %s, %s, p, NULL, 0 FROM generate_series(0, %s) AS p"
    )
    admin = AdminClient(kafka_config(found.kafka))
    with connect(found.database_url) as holder:
        holder.execute(rows, (group, source, PARTITIONS - 1))
        holder.commit()
        holder.execute(
            tables.render("SELECT 1 FROM {offsets} WHERE group_id = %s FOR UPDATE"), (group,)
        )
        gate.touch()
        # Released before the replicas' claims have failed for long enough for them to give
        # their partitions back (consumer.unavailable_timeout).
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not _spread(admin, group, replicas):
            time.sleep(0.2)
        holder.commit()


def _spread(admin: AdminClient, group: str, replicas: int) -> bool:
    try:
        (described,) = admin.describe_consumer_groups([group], request_timeout=5).values()
        members = described.result().members
    except Exception:  # the group may not exist yet
        return False
    assigned = [len(m.assignment.topic_partitions) for m in members]
    return len(assigned) == replicas and sum(assigned) == PARTITIONS and min(assigned) > 0


def _drain(found: Services, box: Scratch, source: str, replicas: int, total: int) -> dict[str, Any]:
    tables = box.schema(f"r{replicas}")
    group = f"group{replicas}"
    base = s1_backlog.settings(found, tables, box.prefix, group).model_copy(
        update={"sagas": ["sagas.transfer:TransferSaga"]}
    )
    stats_dir = RESULTS_DIR / "logs"
    stats_dir.mkdir(parents=True, exist_ok=True)
    names = [f"s7-{replicas}-{i}-{box.run_id}" for i in range(replicas)]
    stats = {name: stats_dir / f"{name}.json" for name in names}
    gate = stats_dir / f"s7-{replicas}-{box.run_id}.go"
    children = [
        Child(
            name,
            ["-m", "benchmarks.s7_replicas", "--child", str(stats[name]), str(gate)],
            settings_env(base.model_copy(update={"instance_id": name})),
        )
        for name in names
    ]
    # Every replica imports and builds its processor first, then all join the group at once:
    # otherwise the first one up drains a small backlog alone before the others arrive.
    ready = [stats[name].with_suffix(".ready") for name in names]
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready):
        if time.monotonic() > deadline or any(c.popen.poll() is not None for c in children):
            for c in children:
                c.stop(5)
            raise RuntimeError(f"replicas did not get ready; see {children[0].log_path}")
        time.sleep(0.05)
    for r in ready:
        r.unlink()
    launched = time.perf_counter()
    _start_together(found, tables, base.consumer.group_id, source, replicas, gate)
    check = tables.render(
        "SELECT count(*), coalesce(sum(next_offset), 0), (SELECT count(*) FROM {outbox})"
        " FROM {offsets} WHERE group_id = %s"
    )
    t0 = done = None
    give_up = launched + max(120.0, total / 50)
    try:
        with connect(found.database_url, autocommit=True) as conn:
            while time.perf_counter() < give_up:
                row = conn.execute(check, (base.consumer.group_id,)).fetchone()
                claimed, committed, pending = (int(x) for x in row) if row else (0, 0, 0)
                now = time.perf_counter()
                if t0 is None and claimed >= PARTITIONS:
                    t0 = now
                if committed >= total and pending == 0:
                    done = now
                    break
                if any(c.popen.poll() is not None for c in children):
                    raise RuntimeError(f"a replica exited early; see {children[0].log_path}")
                time.sleep(0.02)
            owners = conn.execute(
                tables.render(
                    "SELECT owner, count(*) FROM {offsets} WHERE group_id = %s GROUP BY owner"
                ),
                (base.consumer.group_id,),
            ).fetchall()
    finally:
        for c in children:
            c.stop(30)
        gate.unlink(missing_ok=True)
    if done is None or t0 is None:
        raise RuntimeError(f"{replicas} replicas did not drain {total} events in time")
    per_replica = []
    for name in names:
        counts = json.loads(stats[name].read_text()) if stats[name].exists() else {}
        stats[name].unlink(missing_ok=True)
        per_replica.append({"name": name, **counts})
    seconds = done - t0
    return {
        "replicas": replicas,
        "seconds": seconds,
        "events_per_s": total / seconds,
        "seconds_from_launch": done - launched,
        "partitions_by_owner": {str(o): int(n) for o, n in owners},
        "per_replica": per_replica,
    }


def run(found: Services, box: Scratch, options: Options) -> dict[str, Any]:
    events = options.events
    say(
        f"S7 replicas: {events} events on {PARTITIONS} partitions, drained by "
        f"{', '.join(map(str, options.replicas))} replica processes (relaying per owned partition)"
    )
    source = box.topic(TRANSFER_EVENTS_TOPIC, PARTITIONS)
    commands = box.topic(ACCOUNT_COMMANDS_TOPIC, PARTITIONS)
    box.topic("saga-dead-letters", 1)
    s1_backlog.preload(found.kafka, source, events, box.run_id)
    total = sum(end_offsets(found.kafka, source).values())
    runs = []
    for k in options.replicas:
        before = records(found.kafka, commands)
        result = _drain(found, box, source, k, total)
        result["commands_delivered"] = records(found.kafka, commands) - before
        shares = ", ".join(
            f"{r.get('published', '?')} rows ({100 * r.get('relay_cpu_share', 0):.0f}% CPU)"
            for r in result["per_replica"]
        )
        say(
            f"  {k} replica(s): {result['events_per_s']:,.0f} events/s "
            f"({result['seconds']:.1f} s after every partition was claimed); relays: {shares}"
        )
        runs.append(result)
    return {
        "events": events,
        "partitions": PARTITIONS,
        "runs": runs,
        "commands_complete": all(r["commands_delivered"] >= events for r in runs),
    }


def summary(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    for r in result["runs"]:
        published = [p.get("published", 0) for p in r["per_replica"]]
        shares = [100 * p.get("relay_cpu_share", 0.0) for p in r["per_replica"]]
        rows.append(
            (
                "S7",
                f"{r['replicas']} replica(s)",
                f"{r['events_per_s']:,.0f} events/s; relay rows per replica "
                f"{'/'.join(map(str, published))}, relay CPU share "
                f"{'/'.join(f'{s:.0f}%' for s in shares)}",
            )
        )
    if not result["commands_complete"]:
        rows.append(("S7", "commands delivered", "INCOMPLETE: see the JSON report"))
    return rows


def _child(stats_path: Path, gate: Path) -> int:
    """One replica: a processor with the relay's rounds timed; writes its counts on SIGTERM.

    It says it is ready (a file beside ``stats_path``) and starts once ``gate`` exists.
    """
    from processor._bootstrap.processor import build_processor
    from processor.settings import load_settings
    from sagas.transfer import TransferSaga

    proc = build_processor(load_settings(), [TransferSaga])
    stats_path.with_suffix(".ready").touch()
    while not gate.exists():
        time.sleep(0.01)
    proc.start()
    relay = proc.relay
    assert relay is not None
    spent = {"cpu": 0.0, "wall": 0.0}
    inner = relay.run_once

    def timed() -> int:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return inner()
        finally:
            spent["wall"] += time.perf_counter() - wall
            spent["cpu"] += time.thread_time() - cpu

    # The relay thread looks the method up each round: the next round is timed.
    relay.run_once = timed  # type: ignore[method-assign]
    signal.signal(signal.SIGTERM, lambda *_: proc.stop())
    cpu0 = time.process_time()
    proc.run()
    cpu = time.process_time() - cpu0
    worker = proc.worker
    counts = {
        "published": relay.published,
        "records": worker.stats.records if worker is not None else 0,
        "relay_cpu_s": spent["cpu"],
        "relay_wall_s": spent["wall"],
        "process_cpu_s": cpu,
        "relay_cpu_share": spent["cpu"] / cpu if cpu > 0 else 0.0,
    }
    stats_path.write_text(json.dumps(counts))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        sys.exit(_child(Path(sys.argv[2]), Path(sys.argv[3])))
    sys.exit("usage: python -m benchmarks.s7_replicas --child STATS_PATH GATE_PATH")
