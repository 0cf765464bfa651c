"""Schedules that found runtime bugs, kept: each passes, and fails with its bug put back.

A change to the simulator (a new fault, another draw) gives a seed another schedule; the test
then says the seed no longer meets its bug, and ``python -m tests.sim --seeds 1000 --start 0
--bug NAME`` finds one that does.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.sim.run import describe, run

# (the bug as tests/sim/bugs.py names it, a seed whose schedule meets it)
FOUND = [
    # A replica paused past its session claimed, when it woke, the partitions it had been
    # waiting for; the rightful owner, fenced, waited for a rebalance that never came.
    ("fenced-partitions-not-claimed-again", 11),
    # Two assignments before a poll, the database back between: the first's partitions,
    # due to be paused, were claimed by the second's claim and stayed paused for good.
    ("pause-due-after-claim", 67),
    # A refused seek, then the partition revoked and assigned again inside one read: its
    # fresh records were dropped by a set taken before the read.
    ("held-set-taken-before-read", 928),
    # A batch in doubt whose partition another replica had claimed and moved on was said
    # not to have committed.
    ("doubt-judged-by-moved-offsets", 196),
    # A replica paused past its session claimed a partition of its stale assignment; the
    # rightful owner, with no more input there, never learnt it was fenced, and its committed
    # commands of that partition were never published.
    ("fences-learnt-only-by-commits", 32),
    # A partition whose only entries were transaction markers was never stored past them.
    ("markers-only-partition-left-unstored", 1),
]


@pytest.mark.parametrize(("bug", "seed"), FOUND)
def test_a_schedule_that_found_a_bug_passes_and_fails_with_it_back(bug: str, seed: int) -> None:
    fixed = run(seed)
    assert fixed.ok, describe(fixed)
    broken = run(seed, bugs=[bug])
    assert not broken.ok, f"seed {seed} no longer meets {bug}"


def test_the_same_seed_gives_the_same_trace() -> None:
    first = run(5)
    assert first.ok, describe(first)
    assert run(5).trace == first.trace


def test_the_trace_does_not_depend_on_the_interpreter_s_hash_seed() -> None:
    # Sets and dicts iterate in insertion or hash order: a run that depended on the hash seed
    # of strings would replay differently in another process.
    code = "from tests.sim.run import run; print(run(5).trace)"
    traces = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        traces.add(out.stdout.strip())
    assert traces == {run(5).trace}
