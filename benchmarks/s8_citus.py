"""S8, S1's backlog drain on Citus beside single PostgreSQL, with each Citus node's CPU.

The same engine drain as S1 (one replica, a backlog of saga starts over 6 partitions), once with
its schema on the single PostgreSQL server and once on a Citus coordinator (its schema a
distributed schema on one worker), alternating round by round. Each side reports events/s; the
Citus side also the CPU of the coordinator's and each worker's process tree per event, read over
the whole run of the side (the processor's start-up included, so a little high).

A third Citus side, ``citus_buckets``, drains the same backlog with the processor's tables
distributed by bucket (``SAGA_DATABASE__DISTRIBUTED=buckets``, :data:`BUCKETS` buckets for the 6
partitions): its events/s against the distributed schema's, drained right before or after it in
each round, and how the workers share the CPU (issue 52's goals: at least 0.9x, the median of the
rounds' ratios, and the busier worker at most 60% of the two workers' CPU, the median of the
rounds' shares).

The Citus cluster is `SAGA_TEST_CITUS_URL` or the local one (deploy/local/citus.sh); without
either, S8 says so and measures nothing.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from benchmarks import s1_backlog
from benchmarks.boxcpu import Meter, postmaster_pid, tree_seconds
from benchmarks.common import Scratch, Services, say
from devstack import provide_citus
from processor._postgres.connect import ensure_schema
from processor._postgres.schema.citus import placement
from processor._postgres.schema.tables import Tables
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC

# The by-bucket side's bucket count: one per worker of the local cluster, a divisor of the 6
# partitions, so that each partition's sagas are one bucket's and a batch of one worker's
# partitions is one bucket's too (one statement per table, as on the distributed schema).
BUCKETS = 2
# 30,000 events: a side drains them in 5 to 8 s on the local cluster (without TLS between its
# nodes); 10,000 took 2 s, about as long as a processor's start. Single rounds' ratios of the
# two layouts range from 0.7 to 1.1 on two shared cores (a spread of about 0.1 around their
# middle): seven rounds, so that one or two slow minutes do not decide the median. With five,
# the run's median itself still moved from 0.90 to 0.97 between runs of the same code.
DEFAULT_EVENTS = 30_000
QUICK_EVENTS = 3_000
DEFAULT_ROUNDS = 7


@dataclass(frozen=True)
class Options:
    events: int
    rounds: int = DEFAULT_ROUNDS

    @classmethod
    def of(cls, *, quick: bool, events: int | None, rounds: int | None) -> Options:
        return cls(
            events or (QUICK_EVENTS if quick else DEFAULT_EVENTS),
            rounds or (2 if quick else DEFAULT_ROUNDS),
        )


def nodes(coordinator: str) -> dict[str, str]:
    """The URL of every node of the cluster, by name: the coordinator's, ``host:port`` for each
    worker (the coordinator's URL with the worker's host and port)."""
    given = conninfo_to_dict(coordinator)
    with psycopg.connect(coordinator, autocommit=True) as conn:
        workers = conn.execute(
            "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 ORDER BY nodeport"
        ).fetchall()
    out = {"coordinator": coordinator}
    for host, port in workers:
        out[f"{host}:{port}"] = make_conninfo(**{**given, "host": host, "port": str(port)})
    return out


def _drain(
    services: Services, tables: Tables, box: Scratch, events: int, label: str, meter: Meter
) -> dict[str, Any]:
    source = box.topic(f"{label}-{TRANSFER_EVENTS_TOPIC}", s1_backlog.PARTITIONS)
    s1_backlog.preload(services.kafka, source, events, f"{box.run_id}{label}")
    # The processor names its topics by prefix: this side's own, so each drains its backlog.
    prefix = f"{box.prefix}{label}-"
    for name in (ACCOUNT_COMMANDS_TOPIC, "saga-dead-letters"):
        box.topic(f"{label}-{name}", s1_backlog.PARTITIONS if "commands" in name else 1)
    return s1_backlog.run_engine(services, tables, prefix, source, events, meter=meter)


def run(found: Services, box: Scratch, options: Options) -> dict[str, Any]:
    with provide_citus(say) as citus:
        if citus.url is None:
            say(f"S8 skipped: {citus.reason}")
            return {"skipped": citus.reason}
        return _run(found, citus.url, box, options)


def _run(found: Services, citus_url: str, box: Scratch, options: Options) -> dict[str, Any]:
    events = options.events
    cluster = nodes(citus_url)
    pids = {name: postmaster_pid(url) for name, url in cluster.items()}
    say(
        f"S8: S1's drain of {events} events on PostgreSQL and on Citus ({len(cluster) - 1} "
        f"workers), {options.rounds} alternating rounds"
    )
    # Through a worker only where the workers' registered addresses answer from here (not the
    # containers' network names).
    workers = [url for name, url in cluster.items() if name != "coordinator"]
    answer = all(_answers(url) for url in workers)
    sides = _CITUS_SIDES if answer else tuple(s for s in _CITUS_SIDES if s != "citus_worker")
    if not answer:
        say("S8: the workers do not answer from here; the side through a worker is not measured")
    made: list[Tables] = []
    rounds: list[dict[str, Any]] = []
    try:
        for n in range(1, options.rounds + 1):
            row: dict[str, Any] = {}
            single = box.schema(f"pg{n}")
            row["postgres"] = _drain(
                found, single, box, events, f"pg{n}", Meter.find(found.kafka, found.database_url)
            )
            box.settle(single)
            for side in _order(sides, n):
                # The processor runs in this process: what earlier sides left for the collector
                # is collected now, untimed, not during this side's drain.
                gc.collect()
                tables = Tables(schema=f"bench_s8_{side}{n}_{box.run_id}")
                made.append(tables)
                row[side] = _citus_side(
                    found,
                    cluster,
                    pids,
                    tables,
                    box,
                    events,
                    f"{side}{n}",
                    via_worker=side == "citus_worker",
                    buckets=side == "citus_buckets",
                )
                _settle(cluster, tables)
            rounds.append(row)
            say(
                f"round {n}: PostgreSQL {row['postgres']['events_per_s']:,.0f} events/s; "
                + "; ".join(
                    f"{_LABELS[side]} {row[side]['events_per_s']:,.0f} events/s, CPU us/event "
                    + ", ".join(f"{k} {v:.0f}" for k, v in row[side]["node_us"].items())
                    for side in sides
                )
            )
    finally:
        with psycopg.connect(citus_url, autocommit=True) as conn:
            for tables in made:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                        sql.Identifier(tables.schema)
                    )
                )
    pg = statistics.median(r["postgres"]["events_per_s"] for r in rounds)
    median: dict[str, float] = {"postgres_events_per_s": pg}
    for side in sides:
        median[f"{side}_events_per_s"] = per_s = statistics.median(
            r[side]["events_per_s"] for r in rounds
        )
        median[f"{side}_ratio"] = per_s / pg
    if "citus_buckets" in sides:
        # Each round's two drains ran one right after the other (see _order): the median of
        # the rounds' ratios, which the machine's slower and faster minutes move less than the
        # ratio of the sides' medians.
        median["buckets_vs_schema"] = statistics.median(
            r["citus_buckets"]["events_per_s"] / r["citus"]["events_per_s"] for r in rounds
        )
        # The busier worker's share of the two workers' CPU, each round's; the median of them.
        shares = []
        for r in rounds:
            worker_us = [
                us for name, us in r["citus_buckets"]["node_us"].items() if name != "coordinator"
            ]
            shares.append(max(worker_us) / sum(worker_us) if sum(worker_us) > 0 else 0.0)
        median["buckets_busiest_worker_share"] = statistics.median(shares)
    return {"events": events, "sides": list(sides), "rounds": rounds, "median": median}


def _citus_side(
    found: Services,
    cluster: dict[str, str],
    pids: dict[str, int | None],
    tables: Tables,
    box: Scratch,
    events: int,
    label: str,
    *,
    via_worker: bool,
    buckets: bool = False,
) -> dict[str, Any]:
    """One drain on Citus: the schema made through the coordinator (Citus takes DDL there only),
    the processor connected to the coordinator or to the worker that holds the schema; with
    ``buckets``, the tables distributed by bucket over every worker instead."""
    node: str | None
    if buckets:
        ensure_schema(cluster["coordinator"], tables, "buckets", buckets=BUCKETS)
        node = "every worker"
        through = "coordinator"
    else:
        ensure_schema(cluster["coordinator"], tables)
        with psycopg.connect(cluster["coordinator"], autocommit=True) as conn:
            worker = placement(conn, tables.schema)
        node = f"{worker[0]}:{worker[1]}" if worker else None
        through = node if via_worker and node else "coordinator"

    broker = Meter.find(found.kafka, found.database_url).broker
    before = {name: tree_seconds(pid) if pid else None for name, pid in pids.items()}
    side = _drain(
        Services(found.kafka, cluster[through]),
        tables,
        box,
        events,
        label,
        Meter(pids[through], broker),
    )
    after = {name: tree_seconds(pid) if pid else None for name, pid in pids.items()}
    side["schema_on"] = node
    side["through"] = through
    side["node_us"] = {
        name: (a - b) / events * 1e6
        for name, b in before.items()
        if b is not None and (a := after[name]) is not None
    }
    return side


def _settle(cluster: dict[str, str], tables: Tables) -> None:
    """Leaves the cluster quiet for the next side, untimed, as ``Scratch.settle`` leaves one
    PostgreSQL: the side's schema dropped (its dead rows would be vacuumed during the next
    side), a checkpoint on every node and the kernel's dirty pages written. Without it the
    side that wrote to one worker left that worker's background work in the next side's run:
    the by-bucket side, measured right after the side through a worker, saw that worker busier
    (82-91 against 50 us per event) in the rounds where it was the same worker."""
    with psycopg.connect(cluster["coordinator"], autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(tables.schema))
        )
    for url in cluster.values():
        # A node that does not answer from here, or a role without pg_checkpoint: skipped.
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(url, autocommit=True, connect_timeout=5) as conn,
        ):
            conn.execute("CHECKPOINT")
    os.sync()


def _order(sides: tuple[str, ...], n: int) -> tuple[str, ...]:
    """Round ``n``'s sides: the distributed schema and the tables by bucket one right after the
    other, each first in every other round (each side leaves the machine a little different
    for the next), then the others."""
    pair = ("citus", "citus_buckets")
    if not all(p in sides for p in pair):
        return sides
    rest = tuple(s for s in sides if s not in pair)
    return (pair if n % 2 else pair[::-1]) + rest


def _answers(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.OperationalError:
        return False
    return True


_CITUS_SIDES = ("citus", "citus_worker", "citus_buckets")
_LABELS = {
    "citus": "Citus through the coordinator",
    "citus_worker": "Citus through the worker",
    "citus_buckets": "Citus by bucket over the workers",
}


def summary(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    if "skipped" in result:
        return [("S8", "skipped", result["skipped"])]
    median = result["median"]
    rows = [
        ("S8", "single PostgreSQL (median)", f"{median['postgres_events_per_s']:,.0f} events/s")
    ]
    for side in result.get("sides", _CITUS_SIDES):
        label = _LABELS[side]
        last = result["rounds"][-1][side]
        rows.append(("S8", f"{label} (median)", f"{median[f'{side}_events_per_s']:,.0f} events/s"))
        rows.append(("S8", f"{label} / PostgreSQL", f"{median[f'{side}_ratio']:.2f}"))
        for name, us in last["node_us"].items():
            rows.append(("S8", f"{label}: CPU us/event, {name}", f"{us:.0f}"))
        rows.append(("S8", f"{label}: schema on", str(last.get("schema_on"))))
    if "buckets_vs_schema" in median:
        ratio, share = median["buckets_vs_schema"], median["buckets_busiest_worker_share"]
        rows.append(
            (
                "S8",
                "by bucket / distributed schema (goal >= 0.90)",
                f"{ratio:.2f} {'PASS' if ratio >= 0.9 else 'BELOW'}",
            )
        )
        rows.append(
            (
                "S8",
                "by bucket: busiest worker's share of worker CPU (goal <= 0.60)",
                f"{share:.2f} {'PASS' if share <= 0.6 else 'ABOVE'}",
            )
        )
    return rows
