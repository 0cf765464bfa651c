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


def test_partitions_claimed_while_a_pause_is_due_are_not_paused_for_good() -> None:
    # Two assignments reached a replica before its next poll: the first's partitions could not
    # be claimed (the database away) and were due to be paused; the second's claim, the
    # database back, claimed them too. The due pause then stopped them for good: nothing
    # resumed them, and their sagas never ended.
    result = run(148)
    assert result.ok, describe(result)


def test_a_partition_revoked_and_assigned_again_in_one_read_is_not_held_by_its_old_seek() -> None:
    # A seek refused, then the partition revoked and assigned again by callbacks inside one
    # read: the set of held partitions taken before the read still named it, so the fresh
    # assignment's records were dropped, and the next batch committed past them.
    result = run(211)
    assert result.ok, describe(result)
