"""make test's share of new schedules: the seeds of each part, and the check of them."""

from __future__ import annotations

import os

from tests.sim.run import describe, run

__all__ = ["SCHEDULES", "SEED_BASE", "hold_every_invariant"]

SEED_BASE = "SAGA_TEST_SIM_SEED_BASE"
# Schedules per part; make test runs two parts, each in a file of its own (one per worker).
SCHEDULES = 500


def hold_every_invariant(part: int) -> None:
    """Runs part ``part`` of this run's new schedules; fails with the first failure's report."""
    base = int(os.environ[SEED_BASE]) + part * SCHEDULES
    failed = [r for r in (run(seed) for seed in range(base, base + SCHEDULES)) if not r.ok]
    assert not failed, (
        f"{len(failed)} of {SCHEDULES} schedules (seeds {base}..{base + SCHEDULES - 1}) failed: "
        f"{[r.seed for r in failed]}\n" + describe(failed[0])
    )
