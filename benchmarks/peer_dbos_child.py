"""The DBOS peer's child process (see :mod:`benchmarks.peer_dbos`): the DBOS application.

Runs only in the ``bench`` virtualenv, where DBOS Transact is installed:
``python -m benchmarks.peer_dbos_child SPEC_JSON`` prints one JSON line.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import sys
import time
import uuid
from importlib.metadata import version
from typing import Any

import psycopg
from dbos import DBOS, SetWorkflowID
from psycopg import sql

from benchmarks.boxcpu import tree_seconds
from benchmarks.s10_saga import COMPENSATED, COMPLETED, credit_refused, half_rate, latency_summary

QUEUE = "s10-transfers"
WORKER_CONCURRENCY = 100
# How often the queue's thread looks for work: the default (1 s) would cap a backlog at 100
# workflows a second with the concurrency above, a limit of the setting, not of DBOS.
QUEUE_POLL = 0.05
WARM_UP = 50
# The status rows are polled: a workflow's end is a committed row, with nothing to wait on.
POLL = 0.05


@DBOS.step()
def debit(transfer_id: str) -> None:
    """The source is debited: no work beyond the call."""


@DBOS.step()
def credit(transfer_id: str) -> bool:
    return not credit_refused(transfer_id)


@DBOS.step()
def reverse(transfer_id: str) -> None:
    """The debit is given back: no work beyond the call."""


@DBOS.workflow()
def transfer(transfer_id: str) -> str:
    debit(transfer_id)
    if credit(transfer_id):
        return COMPLETED
    reverse(transfer_id)
    return COMPENSATED


class Peer:
    """The status reads, the box's CPU readings and the two phases."""

    def __init__(self, url: str, schema: str, postmaster: int | None, deadline: float) -> None:
        self.url = url
        self.schema = schema
        self.postmaster = postmaster
        self.deadline = deadline
        self.run_id = uuid.uuid4().hex[:8]
        self.conn = psycopg.connect(url, autocommit=True)

    def box(self) -> tuple[float, float]:
        """CPU seconds of this process and of PostgreSQL (postmaster, backends, reaped ones)."""
        pg = tree_seconds(self.postmaster) if self.postmaster is not None else None
        return time.process_time(), pg or 0.0

    def ids(self, label: str, count: int) -> list[str]:
        return [f"tr-{self.run_id}-{label}-{n:07d}" for n in range(count)]

    def _ended(self, label: str) -> tuple[int, float]:
        query = sql.SQL(
            "SELECT count(*), coalesce(max(coalesce(completed_at, updated_at)), 0)"
            " FROM {}.workflow_status WHERE workflow_uuid LIKE %s"
            " AND status IN ('SUCCESS', 'ERROR', 'CANCELLED')"
        ).format(sql.Identifier(self.schema))
        row = self.conn.execute(query, (f"tr-{self.run_id}-{label}-%",)).fetchone()
        assert row is not None
        return int(row[0]), float(row[1]) / 1000

    def wait_ended(self, label: str, count: int) -> float:
        """Waits until ``count`` workflows of the phase ended; returns the last one's end."""
        give_up = time.monotonic() + self.deadline
        while (got := self._ended(label))[0] < count:
            if time.monotonic() > give_up:
                raise RuntimeError(f"{label}: {got[0]}/{count} ended within {self.deadline} s")
            time.sleep(POLL)
        return got[1]

    def ends(self, label: str) -> dict[str, tuple[float, str]]:
        query = sql.SQL(
            "SELECT s.workflow_uuid, coalesce(s.completed_at, s.updated_at), o.output"
            " FROM {}.workflow_status s LEFT JOIN {}.workflow_output o USING (workflow_uuid)"
            " WHERE s.workflow_uuid LIKE %s"
        ).format(sql.Identifier(self.schema), sql.Identifier(self.schema))
        rows = self.conn.execute(query, (f"tr-{self.run_id}-{label}-%",)).fetchall()
        return {str(r[0]): (float(r[1]) / 1000, _outcome(r[2])) for r in rows}

    def saturate(self, label: str, count: int) -> dict[str, Any]:
        ids = self.ids(label, count)
        t0, box0 = time.time(), self.box()
        for tid in ids:
            with SetWorkflowID(tid):
                DBOS.enqueue_workflow(QUEUE, transfer, tid)
        end = self.wait_ended(label, count)
        box1 = self.box()
        outcomes: dict[str, int] = {}
        for _, outcome in self.ends(label).values():
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        seconds = end - t0
        return {
            "sagas": count,
            "seconds": seconds,
            "sagas_per_s": count / seconds,
            "cpu_s": {"worker": box1[0] - box0[0], "postgres": box1[1] - box0[1]},
            "outcomes": outcomes,
        }

    def latency(self, rate: float, seconds: float) -> dict[str, Any]:
        ids = self.ids("lat", max(1, math.ceil(rate * seconds)))
        sent: dict[str, float] = {}
        t0 = time.monotonic()
        for n, tid in enumerate(ids):
            # Paced by the clock: start n is due n / rate seconds after the first.
            time.sleep(max(0.0, t0 + n / rate - time.monotonic()))
            sent[tid] = time.time()
            with SetWorkflowID(tid):
                DBOS.start_workflow(transfer, tid)
        self.wait_ended("lat", len(ids))
        ends = self.ends("lat")
        return {
            "rate": rate,
            "seconds": seconds,
            **latency_summary([ends[t][0] - s for t, s in sent.items()]),
        }


def _outcome(output: str | None) -> str:
    """How a workflow ended, from its stored output (its serializer's text, base64 of a pickle
    by default): the outcome's name appears in it whole."""
    if output is None:
        return "none"
    with contextlib.suppress(ValueError):
        raw = base64.b64decode(output, validate=True)
        return next((o for o in (COMPLETED, COMPENSATED) if o.encode() in raw), "other")
    return next((o for o in (COMPLETED, COMPENSATED) if o in output), "other")


def main(spec: dict[str, Any]) -> dict[str, Any]:
    url, schema = spec["database_url"], spec["schema"]
    DBOS(
        config={
            "name": "s10-dbos",
            "system_database_url": url,
            "dbos_system_schema": schema,
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    try:
        DBOS.register_queue(
            QUEUE, worker_concurrency=WORKER_CONCURRENCY, polling_interval_sec=QUEUE_POLL
        )
        peer = Peer(url, schema, spec.get("postmaster"), float(spec["deadline"]))
        peer.saturate("warm", WARM_UP)
        sat = peer.saturate("sat", int(spec["sagas"]))
        lat = peer.latency(half_rate(sat["sagas_per_s"]), float(spec["seconds"]))
        peer.conn.close()
    finally:
        DBOS.destroy(workflow_completion_timeout_sec=10)
    return {
        "saturation": sat,
        "latency": lat,
        "setup": {
            "dbos": f"dbos {version('dbos')}",
            "saturation_start": f"DBOS.enqueue_workflow on a queue ({QUEUE}), one thread",
            "latency_start": "DBOS.start_workflow, paced",
            "queue_worker_concurrency": WORKER_CONCURRENCY,
            "queue_polling_interval_s": QUEUE_POLL,
            "steps": "@DBOS.step functions, trivial bodies",
            "system_database": f"the same PostgreSQL, schema {schema} (dropped after)",
            "warm_up_workflows": WARM_UP,
        },
    }


if __name__ == "__main__":
    result = main(json.loads(sys.argv[1]))
    print(json.dumps(result), flush=True)
    # DBOS was destroyed above; its remaining daemon threads need no teardown.
    os._exit(0)
