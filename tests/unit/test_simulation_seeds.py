"""Seeds of the deterministic simulation (tests/sim) that found bugs, kept as regressions."""

from __future__ import annotations

from tests.sim.run import describe, run


def test_a_replica_fenced_by_a_zombie_s_claim_claims_its_partitions_again() -> None:
    # A replica frozen past its session, waiting to claim partitions, claimed them when it woke
    # before its poll told it they were gone; the rightful owner, fenced, waited for a rebalance
    # that never came and its sagas never ended (stuck while healing).
    result = run(1)
    assert result.ok, describe(result)


def test_the_same_seed_gives_the_same_trace() -> None:
    assert run(1).trace == run(1).trace
