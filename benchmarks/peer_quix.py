"""The peer: the same workload on Quix Streams, the Python stream processor a user would pick.

Exactly-once processing (Kafka transactions), the saga state keyed by saga id in Quix's own
store (RocksDB plus a changelog topic), one DebitAccount command per event to an output topic,
and a checkpoint every ``commit_every`` messages or ``commit_interval`` seconds, whichever
comes first.

Quix is in the optional ``bench`` extra, which ``make bench`` installs into a virtualenv of its
own (``.venv-bench``): Quix pins an older confluent-kafka, and the engine is measured with its
own versions. The peer runs as a child process of that interpreter
(``python -m benchmarks.peer_quix SPEC_JSON`` prints one JSON line); without it the peer is
skipped with a line saying so.

The clock runs from the first message processed (joining the group is not backlog work, as for
the engine) until ``Application.run`` returns, its last checkpoint committed. The peer reads the
box's CPU (its own process, the broker's, PostgreSQL's) itself at both ends of that window, from
the pids the parent found: the parent could not read them at the child's instants.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined, unused-ignore]

from benchmarks.boxcpu import Meter, Usage
from benchmarks.common import REPO, kafka_config
from benchmarks.raw_sql import Measured

PYTHON = Path(os.environ.get("SAGA_BENCH_PYTHON", REPO / ".venv-bench" / "bin" / "python"))


def available() -> bool:
    return PYTHON.exists()


def quix_loop(
    kafka: str,
    source: str,
    sink: str,
    *,
    events: int,
    commit_every: int,
    commit_interval: float,
    meter: Meter | None = None,
) -> Measured:
    """Runs the peer in its own interpreter; returns its rate and CPU time."""
    spec = json.dumps(
        {
            "kafka": kafka,
            "source": source,
            "sink": sink,
            "events": events,
            "commit_every": commit_every,
            "commit_interval": commit_interval,
            "meter": meter.to_json() if meter else None,
        }
    )
    done = subprocess.run(
        [str(PYTHON), "-m", "benchmarks.peer_quix", spec],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"Quix peer failed: {done.stderr[-2000:]}")
    out = json.loads(lines[-1])
    box = Usage.from_json(out["box"]) if out.get("box") else None
    return Measured(out["count"], out["seconds"], out["cpu"], out["version"], box=box)


def _drain(
    kafka: str,
    source: str,
    sink: str,
    *,
    events: int,
    commit_every: int,
    commit_interval: float,
    meter: Meter | None,
) -> dict[str, Any]:
    """Drains `events` records of `source` through a stateful, exactly-once Quix application."""
    from importlib.metadata import version

    # Only in .venv-bench (the `bench` extra), where this function runs.
    from quixstreams import Application  # type: ignore[import-not-found, unused-ignore]

    group = f"bench-quix-{uuid.uuid4().hex[:8]}"
    seen = {"n": 0, "t0": 0.0, "c0": 0.0}
    box0: list[Usage] = []

    def step(value: dict[str, Any], state: Any) -> dict[str, Any]:
        if not seen["n"]:
            seen["t0"], seen["c0"] = time.perf_counter(), time.process_time()
            if meter is not None:
                box0.append(meter.read())
        seen["n"] += 1
        state.set(
            "saga",
            {
                "transfer_id": value["transfer_id"],
                "source_account_id": value["source_account_id"],
                "target_account_id": value["target_account_id"],
                "amount": value["amount"],
                "debit_confirmed": False,
                "credit_confirmed": False,
            },
        )
        return {
            "transfer_id": value["transfer_id"],
            "account_id": value["source_account_id"],
            "amount": value["amount"],
        }

    with tempfile.TemporaryDirectory(prefix="bench-quix-") as state_dir:
        app = Application(
            broker_address=kafka,
            consumer_group=group,
            auto_offset_reset="earliest",
            processing_guarantee="exactly-once",
            commit_every=commit_every,
            commit_interval=commit_interval,
            state_dir=state_dir,
            loglevel="WARNING",
            consumer_extra_config={"log_level": 3},
            producer_extra_config={"log_level": 3},
        )
        sdf = app.dataframe(app.topic(source, value_deserializer="json"))
        sdf = sdf.apply(step, stateful=True)
        sdf.to_topic(app.topic(sink, value_serializer="json"))
        app.run(count=events, collect=False, timeout=0.0)
        elapsed = time.perf_counter() - seen["t0"]
        cpu = time.process_time() - seen["c0"]
        box = meter.read().minus(box0[0]).to_json() if meter is not None and box0 else None
    # Quix made changelog topics for its store; they belong to this run only.
    admin = AdminClient(kafka_config(kafka))
    leftovers = [t for t in admin.list_topics(timeout=10).topics if group in t]
    if leftovers:
        for future in admin.delete_topics(leftovers, operation_timeout=30).values():
            try:
                future.result()
            except Exception as e:  # harmless leftovers
                logging.getLogger(__name__).warning("could not delete %s", e)
    done = int(seen["n"])
    if done < events:
        raise RuntimeError(f"Quix peer: {done}/{events} events")
    return {
        "count": done,
        "seconds": elapsed,
        "cpu": cpu,
        "box": box,
        "version": version("quixstreams"),
    }


if __name__ == "__main__":
    given = json.loads(sys.argv[1])
    result = _drain(
        given["kafka"],
        given["source"],
        given["sink"],
        events=given["events"],
        commit_every=given["commit_every"],
        commit_interval=given["commit_interval"],
        meter=Meter(**given["meter"]) if given.get("meter") else None,
    )
    print(json.dumps(result), flush=True)
