"""S8, S1's backlog drain on Citus beside single PostgreSQL, with each Citus node's CPU.

The same engine drain as S1 (one replica, a backlog of saga starts over 6 partitions), once with
its schema on the single PostgreSQL server and once on a Citus coordinator (its schema a
distributed schema on one worker), alternating round by round. Each side reports events/s; the
Citus side also the CPU of the coordinator's and each worker's process tree per event, read over
the whole run of the side (the processor's start-up included, so a little high).

The Citus cluster is `SAGA_TEST_CITUS_URL` or the local one (deploy/local/citus.sh); without
either, S8 says so and measures nothing.
"""

from __future__ import annotations

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
from processor.postgres.citus import placement
from processor.postgres.connect import ensure_schema
from processor.postgres.schema import Tables
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC

DEFAULT_EVENTS = 10_000
QUICK_EVENTS = 3_000


@dataclass(frozen=True)
class Options:
    events: int
    rounds: int = 2

    @classmethod
    def of(cls, *, quick: bool, events: int | None, rounds: int | None) -> Options:
        return cls(events or (QUICK_EVENTS if quick else DEFAULT_EVENTS), rounds or 2)


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
    citus_side = Services(found.kafka, citus_url)
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
            tables = Tables(schema=f"bench_s8_citus{n}_{box.run_id}")
            made.append(tables)
            ensure_schema(citus_url, tables)
            with psycopg.connect(citus_url, autocommit=True) as conn:
                worker = placement(conn, tables.schema)
            before = {name: tree_seconds(pid) if pid else None for name, pid in pids.items()}
            side = _drain(
                citus_side,
                tables,
                box,
                events,
                f"citus{n}",
                Meter(pids["coordinator"], Meter.find(found.kafka, found.database_url).broker),
            )
            after = {name: tree_seconds(pid) if pid else None for name, pid in pids.items()}
            side["schema_on"] = f"{worker[0]}:{worker[1]}" if worker else None
            side["node_us"] = {
                name: (a - b) / events * 1e6
                for name, b in before.items()
                if b is not None and (a := after[name]) is not None
            }
            row["citus"] = side
            rounds.append(row)
            say(
                f"round {n}: PostgreSQL {row['postgres']['events_per_s']:,.0f} events/s, Citus "
                f"{side['events_per_s']:,.0f} events/s; CPU us/event by node "
                + ", ".join(f"{k} {v:.0f}" for k, v in side["node_us"].items())
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
    ci = statistics.median(r["citus"]["events_per_s"] for r in rounds)
    return {
        "events": events,
        "rounds": rounds,
        "median": {"postgres_events_per_s": pg, "citus_events_per_s": ci, "ratio": ci / pg},
    }


def summary(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    if "skipped" in result:
        return [("S8", "skipped", result["skipped"])]
    median = result["median"]
    rows = [
        ("S8", "single PostgreSQL (median)", f"{median['postgres_events_per_s']:,.0f} events/s"),
        ("S8", "Citus (median)", f"{median['citus_events_per_s']:,.0f} events/s"),
        ("S8", "Citus / PostgreSQL", f"{median['ratio']:.2f}"),
    ]
    last = result["rounds"][-1]["citus"]
    for name, us in last["node_us"].items():
        rows.append(("S8", f"CPU us/event, {name}", f"{us:.0f}"))
    rows.append(("S8", "schema on", str(last.get("schema_on"))))
    return rows
