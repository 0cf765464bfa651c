"""What /healthz and /readyz answer, as plain functions of the processor's state.

Liveness fails only when restarting the process would help: a loop died, or the consumer loop
stopped stepping. A database outage is a readiness matter (the replica gives its partitions
back and waits; a restart would not bring the database back).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Probe", "liveness", "readiness"]


@dataclass(frozen=True, slots=True)
class Probe:
    """A probe's answer: ``ok`` gives the HTTP status (200 or 503), ``detail`` the JSON body."""

    ok: bool
    detail: Mapping[str, Any]


def liveness(loops: Mapping[str, bool], last_step: float | None, stale_after: float) -> Probe:
    """Every loop alive, and the consumer loop stepped within ``stale_after`` seconds.

    Args:
        loops: Each loop's name and whether it is alive (``Processor.health()``).
        last_step: time.monotonic() when the consumer loop last began a poll.
        stale_after: Longest gap between two polls of a healthy consumer loop.
    """
    since = None if last_step is None else time.monotonic() - last_step
    stepping = since is not None and since < stale_after
    ok = bool(loops) and all(loops.values()) and stepping
    detail = {
        "status": "ok" if ok else "unhealthy",
        "loops": dict(loops),
        "consumer_step_age_seconds": None if since is None else round(since, 3),
    }
    return Probe(ok, detail)


def readiness(
    *,
    sample_age: float | None,
    sample_error: str | None,
    schema_version: int | None,
    expected_version: int,
    worker: Mapping[str, object] | None,
    stale_after: float,
) -> Probe:
    """Database reachable, schema at the expected version, partitions claimed or none due.

    Args:
        sample_age: Seconds since the last good sample of the database; None before it.
        sample_error: Why the last sample failed, if it did (the last attempt, not an old one).
        schema_version: The version the last good sample read.
        expected_version: The version this build migrates to.
        worker: ``Worker.health()``; None before the consumer exists.
        stale_after: Oldest good sample that still counts as "reachable".
    """
    problems: list[str] = []
    # The last attempt failing counts at once: an idle replica touches the database only through
    # the sampler, and waiting for the good sample to go stale kept an outage ready for a minute.
    if sample_error is not None or sample_age is None or sample_age >= stale_after:
        problems.append("database not reachable" + (f": {sample_error}" if sample_error else ""))
    # A newer schema is a rollback's: migrations only add, so this code runs on it.
    if schema_version is not None and schema_version < expected_version:
        problems.append(f"schema at version {schema_version}, expected {expected_version}")
    if worker is None:
        problems.append("consumer not started")
    elif worker.get("detached"):
        problems.append("partitions given back: the database was unavailable")
    elif worker.get("unclaimed"):
        problems.append(f"{worker['unclaimed']} assigned partition(s) not claimed yet")
    detail = {
        "status": "ready" if not problems else "unready",
        "problems": problems,
        "database_sample_age_seconds": None if sample_age is None else round(sample_age, 3),
        "schema_version": schema_version,
        "worker": dict(worker) if worker is not None else None,
    }
    return Probe(not problems, detail)


ProbeFn = Callable[[], Probe]
