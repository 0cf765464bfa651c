"""The simulator finds each fixed runtime bug when it is put back (tests/sim/bugs.py)."""

from __future__ import annotations

import pytest

from tests.sim.bugs import BUGS
from tests.sim.run import describe, replay_command, run

pytestmark = pytest.mark.slow

# Schedules tried, from seed START, before a bug counts as not found.
START = 5000
LIMIT = 2000


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_the_simulator_finds_the_bug_put_back(bug: str) -> None:
    for seed in range(START, START + LIMIT):
        broken = run(seed, bugs=[bug])
        if not broken.ok:
            break
    else:
        pytest.fail(f"{bug} not found in {LIMIT} schedules: {BUGS[bug][0]}")
    print(f"{bug}: found at seed {seed} ({seed - START + 1} schedules): {replay_command(broken)}")
    # The same schedule with the fix holds every invariant: the failure is the bug's.
    fixed = run(seed)
    assert fixed.ok, describe(fixed)
