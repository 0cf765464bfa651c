"""S10's DBOS peer: the transfer saga as a DBOS Transact workflow of three steps.

``@DBOS.workflow`` calling debit, credit and, on a refused credit, the reversal, each a
``@DBOS.step`` whose body is the shared decision of :mod:`benchmarks.s10_saga`. DBOS keeps its
state in PostgreSQL: the same server as the engine's, in a schema of this run's own that is
dropped after. The application runs in a child process of the ``bench`` virtualenv
(:mod:`benchmarks.peer_dbos_child`; its SQLAlchemy and its other dependencies stay out of the
engine's environment), which measures two phases:

- saturation: N workflows enqueued on a DBOS queue (one thread enqueueing, at most 100 running
  at once, the queue polled every 50 ms), timed from the first enqueue until the last one
  ended, by the status rows' completion times; the box's CPU (the child and PostgreSQL) over
  the same window;
- latency: workflows started with ``DBOS.start_workflow`` at half of that rate for a few
  seconds; each one's latency is its completion time minus the moment it was started.

An untimed warm-up of a few workflows goes first.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from benchmarks.boxcpu import Meter
from benchmarks.common import BENCH_PYTHON, Scratch, bench_child

CHILD_DEADLINE = 900.0


def measure(
    box: Scratch, meter: Meter, sagas: int, seconds: float, deadline: float
) -> dict[str, Any]:
    """The peer's result, or ``{"skipped": reason}`` when it cannot run here."""
    if not BENCH_PYTHON.exists():
        return {"skipped": f"no {BENCH_PYTHON} (`make bench` makes it with the `bench` extra)"}
    schema = f"bench_s10_dbos_{box.run_id}"
    url = box.services.database_url
    try:
        got = bench_child(
            "benchmarks.peer_dbos_child",
            {
                "database_url": url,
                "schema": schema,
                "postmaster": meter.postmaster,
                "sagas": sagas,
                "seconds": seconds,
                "deadline": deadline,
            },
            CHILD_DEADLINE,
        )
    finally:
        # DBOS made the schema on launch; it is this run's only.
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    sat = got["saturation"]
    cpu = sat["cpu_s"]
    if meter.postmaster is None:
        cpu["postgres"] = None
    sat["box_us"] = sum(v for v in cpu.values() if v is not None) / sat["sagas"] * 1e6
    got["setup"]["sagas"] = sagas
    got["setup"]["box_cpu"] = "the child (DBOS application) and PostgreSQL's process tree"
    return got
