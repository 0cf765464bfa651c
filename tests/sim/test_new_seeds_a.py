"""New schedules every run: half of make test's simulation budget (the other file has the rest).

The seeds start at SAGA_TEST_SIM_SEED_BASE, drawn afresh each run and printed in pytest's header
(tests/conftest.py); set it to run the same seeds again.
"""

from __future__ import annotations

import os

import pytest

from tests.sim.run import describe, run

pytestmark = pytest.mark.slow

SCHEDULES = 500
PART = 0


def test_new_schedules_hold_every_invariant() -> None:
    base = int(os.environ["SAGA_TEST_SIM_SEED_BASE"]) + PART * SCHEDULES
    failed = [r for r in (run(seed) for seed in range(base, base + SCHEDULES)) if not r.ok]
    assert not failed, (
        f"{len(failed)} of {SCHEDULES} schedules (seeds {base}..{base + SCHEDULES - 1}) failed: "
        f"{[r.seed for r in failed]}\n" + describe(failed[0])
    )
