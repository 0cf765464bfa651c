"""The phases of a split run (``python -m tests.run --split``, what ``make test`` does)."""

from __future__ import annotations

from pathlib import Path

import pytest

PHASE = "SAGA_TEST_PHASE"
"""Which part of the suite a pytest process runs: one of :data:`PHASES`, or ``citus``."""

CITUS_LAYOUT = "SAGA_TEST_CITUS_LAYOUT"
"""``buckets``: the processors a test starts (through ``tests.support.harness.settings_for``)
distribute their tables by bucket (:data:`CITUS_BUCKETS` of them) instead of making their
schema a distributed schema. The Citus phase sets it per test (:data:`CITUS_LAYOUTS`)."""

CITUS_BUCKETS = 2
"""The bucket count of the processors of a ``buckets`` run: one bucket per worker of the local
cluster, so that every part's statements go to both workers, a commit may span them, and a topic
of the tests' usual six partitions puts three on each bucket. Each statement that names no saga
runs once per bucket, so two cost a third of six; the Citus tests (tests/citus) place several
buckets on each worker themselves."""

PHASES = ("parallel", "e2e", "serial")
"""The phases of a split run against single PostgreSQL, in order (see :func:`phase_of`)."""

CITUS_CRASH_TESTS = (
    "tests/e2e/test_crash_recovery.py",
    "tests/e2e/test_fencing.py",
    "tests/e2e/test_deadline_failover.py",
    "tests/e2e/test_ordering.py",
    "tests/e2e/test_relay_handover.py",
)
"""The end-to-end tests of exactly-once effects under crashes that the Citus phase runs."""

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
    "tests/integration/test_frozen_mid_statement.py",
    "tests/integration/test_duplicates.py",
)
"""Integration tests of the parts around the hot path that the Citus phase runs."""

CITUS_LAYOUTS: dict[str, tuple[str, ...]] = {
    # A distributed schema sends the statements one PostgreSQL gets to the one worker that holds
    # the schema, which the other phases test; what it adds is the coordinator's routing and
    # its commit, which the kills around a commit exercise. By bucket every part has statements
    # of its own, and a commit may span two workers: every crash and every part runs there.
    "tests/e2e/test_crash_recovery.py": ("schema", "buckets"),
    **{path: ("buckets",) for path in CITUS_CRASH_TESTS[1:]},
    **{path: ("buckets",) for path in CITUS_AROUND_TESTS},
    # A participant service's tables: a distributed schema, or by the bucket of each command's
    # key with the service's tables following or shared (reference tables).
    "tests/contract/test_participant_contract.py": ("schema", "buckets"),
    "tests/integration/test_participant_app_crashes.py": ("schema", "buckets"),
}
"""The layouts the Citus phase runs each of these files on (a parameter of every test in it:
``schema``, each processor's schema a distributed schema, the default; ``buckets``). The
other contract suites and the Citus tests name their layout themselves."""

CITUS_TESTS = (
    "tests/contract",
    "tests/citus",
    *CITUS_LAYOUTS,
    "tests/integration/test_participant_app_crashes.py",
)
"""What the ``citus`` phase runs against a Citus coordinator: the contract suites' PostgreSQL
cases, the Citus tests, the tests of exactly-once effects under crashes (the processor's
end-to-end ones, and a participant service killed mid-command) and of the parts around the hot
path, on the layouts :data:`CITUS_LAYOUTS` gives. The rest of the integration suite passes on
Citus too (101 tests when last run by hand) but for two files that assert plain PostgreSQL's
plans; it is left out to keep the phase short."""

NOT_ON_CITUS = ("memory", "sqlite", "kafka", "registry")
"""The contract suites' cases that have no PostgreSQL in them (their parameter's first word):
the other phases run them; the Citus phase leaves them out."""


NOT_ON_CITUS_TESTS = (
    # Fifty thousand sagas through retention measure the tables' bound under volume, which
    # the plain phase shows; the other retention tests run its statements by bucket.
    "test_tables_stay_bounded_while_fifty_thousand_sagas_start_and_end",
    # Parking by bucket is its list, its lock and its retries, which the command line's list and
    # retry, the retry of every match and the held messages' replay run; these four add the
    # engine's side of parking, whose statements are the batch's.
    "test_a_saga_whose_start_failed_is_started_by_the_retry",
    "test_parked_retry_is_an_operator_record_the_running_processor_applies",
    "test_a_saga_parked_before_a_growth_is_retried_after_it_with_its_commands_in_order",
    "test_a_saga_function_that_raises_is_parked_and_a_retry_replays_it_to_the_end",
    # An operator's decisions by bucket: an escalated step and a waiting plain saga run them;
    # an undo and a cancel add saga logic over the same statements.
    "test_an_escalated_undo_is_resolved_from_the_cli",
    "test_cancel_before_the_debit_is_confirmed_reverses_it",
    # The poller's claims by bucket run in every other deadline test; this one times its wake.
    "test_firing_is_prompt_whatever_the_polling_interval",
)
"""Tests of the files of :data:`CITUS_LAYOUTS` that the Citus phase leaves out."""


def citus_layouts(path: Path, root: Path) -> tuple[str, ...]:
    """The layouts the Citus phase runs the tests of ``path`` on; none: the test names its own."""
    return CITUS_LAYOUTS.get(path.relative_to(root).as_posix(), ())


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
        return not any(f"[{case}" in item.nodeid for case in NOT_ON_CITUS) and (
            getattr(item, "originalname", item.name) not in NOT_ON_CITUS_TESTS
        )
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
