"""The phases of a split run (``python -m tests.run --split``, what ``make test`` does)."""

from __future__ import annotations

from pathlib import Path

import pytest

PHASE = "SAGA_TEST_PHASE"
"""Which part of the suite a pytest process runs: one of :data:`PHASES`, or ``citus``."""

CITUS_LAYOUT = "SAGA_TEST_CITUS_LAYOUT"
"""``buckets``: the processors the Citus tests start distribute their tables by bucket
(:data:`CITUS_BUCKETS` of them) instead of making their schema a distributed schema."""

CITUS_BUCKETS = 6
"""The bucket count of the processors of a ``buckets`` run: the tests' usual partition count."""

PHASES = ("parallel", "e2e", "serial")
"""The phases of a split run against single PostgreSQL, in order (see :func:`phase_of`)."""

CITUS_CRASH_TESTS = (
    "tests/e2e/test_crash_recovery.py",
    "tests/e2e/test_fencing.py",
    "tests/e2e/test_deadline_failover.py",
    "tests/e2e/test_ordering.py",
    "tests/e2e/test_relay_handover.py",
)
"""The end-to-end tests of exactly-once effects under crashes: the Citus phase runs them on both
layouts."""

CITUS_AROUND_TESTS = (
    # The parts around the hot path whose statements differ with the tables by bucket (each runs
    # bucket by bucket, or fans out where it names no saga): retention, operator commands and
    # their trail, the console's reads and its least-privilege roles, partition growth, dead
    # letters, parking, deadlines, the relay per partition, duplicates.
    "tests/integration/test_retention.py",
    "tests/integration/test_operator_decisions.py",
    "tests/integration/test_operator_trail.py",
    "tests/integration/test_cli_audit.py",
    "tests/integration/test_console_reader.py",
    "tests/integration/test_console_filters.py",
    "tests/integration/test_console_roles.py",
    "tests/integration/test_growth.py",
    "tests/integration/test_dead_letters.py",
    "tests/integration/test_parking.py",
    "tests/integration/test_deadlines.py",
    "tests/integration/test_relay_partitions.py",
    "tests/integration/test_duplicates.py",
)
"""Integration tests the Citus phase runs with the tables by bucket only. On a distributed
schema (the default layout on Citus) these parts send the very statements they send to one
PostgreSQL, which the other phases test, to the one worker that holds the schema."""

CITUS_TESTS = (
    "tests/contract",
    "tests/citus",
    *CITUS_CRASH_TESTS,
    "tests/integration/test_participant_app_crashes.py",
)
"""What the ``citus`` phase runs against a Citus coordinator with the default layout (each
processor's schema a distributed schema): the contract suites' PostgreSQL cases, the Citus
tests, and the tests of exactly-once effects under crashes (the processor's end-to-end ones,
and a participant service killed mid-command). The rest of the integration suite passes on
Citus too (101 tests when last run by hand) but for two files that assert plain PostgreSQL's
plans; it is left out to keep the phase short."""


CITUS_BUCKET_TESTS = (*CITUS_CRASH_TESTS, *CITUS_AROUND_TESTS)
"""What the Citus phase runs with :data:`CITUS_LAYOUT` ``buckets``: the tests that start
processors (through ``tests.support.harness.settings_for``), whose tables are then distributed by
bucket. The contract suites and the Citus tests name their layout themselves; a participant
service told ``buckets`` makes a distributed schema, which the Citus phase runs already."""

LONGEST_FIRST = (
    "tests/e2e/test_restarts_under_load.py",
    "tests/e2e/test_liveness.py",
    "tests/e2e/test_stop_without_broker.py",
    "tests/e2e/test_participant_crashes.py",
    "tests/e2e/test_deadline_failover.py",
    "tests/e2e/test_demo_restarts.py",
    "tests/e2e/test_partition_growth.py",
    "tests/e2e/test_registry_outage.py",
    "tests/e2e/test_fencing.py",
    "tests/e2e/test_crash_recovery.py",
    "tests/e2e/test_large_records.py",
)
"""The end-to-end files that take longest (30 to 90 s each on a two-core machine), longest
first. The end-to-end phase starts them first: started last, one of them ran for a minute on
one worker while the other had nothing left to do."""


def longest_first(items: list[pytest.Item], root: Path) -> list[pytest.Item]:
    """``items`` with those of :data:`LONGEST_FIRST` first, in its order; the rest keep theirs."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        return rank.get(item.path.relative_to(root).as_posix(), len(rank))

    return sorted(items, key=key)


def kept(item: pytest.Item, phase: str) -> bool:
    """Whether ``item`` runs in ``phase`` of a split run."""
    citus = item.get_closest_marker("citus") is not None
    if phase == "citus":
        # The in-memory side of a contract suite has run already; it has no database.
        return "[memory" not in item.nodeid
    return not citus and phase_of(item) == phase


def phase_of(item: pytest.Item) -> str:
    """The phase of a split run that ``item`` belongs to.

    - ``serial``: it disturbs the shared services (restarts the broker, stops a Citus node),
      so it runs with no other test.
    - ``e2e``: end-to-end. These run several processes each and measure bounds in seconds (a
      shutdown budget, a lease, a session timeout) with slack for a loaded two-core machine;
      they run two at a time, never beside the parallel phase's four workers.
    - ``parallel``: unit, contract and integration tests, which mostly wait on the services.
    """
    if item.get_closest_marker("serial") is not None:
        return "serial"
    if "e2e" in item.path.parts:
        return "e2e"
    return "parallel"
