"""Per-saga order across partitions and replicas, including a cooperative rebalance mid-run."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import (
    E2EEnv,
    assert_invariants,
    log_lines,
    new_workload,
    publish_steps,
    wait_drained,
)
from tests.support.harness import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SAGAS = 150


def test_per_saga_order_holds_with_two_replicas_and_a_rebalance(e2e_env: E2EEnv) -> None:
    env = e2e_env
    reader = env.reader()
    workload = new_workload(SAGAS)
    # The first two steps of every saga are queued before anyone consumes, so the second
    # replica joins (and partitions move, cooperatively) while a backlog is being worked off.
    publish_steps(env, workload, range(2))
    # Small batches: many commits per partition, so the handover falls between batches.
    first = env.start("first", consumer={"batch_size": 25})
    wait_until(
        lambda: env.scalar("SELECT count(*) FROM saga_history") > 0,
        timeout=90,
        what="the first replica applying events",
    )
    second = env.start("second", consumer={"batch_size": 25})
    wait_until(
        lambda: log_lines(second, r"assigned \[\("), timeout=90, what="partitions for the second"
    )
    # The last step arrives after the handover: every saga's final event is handled by
    # whichever replica owns its partition now, after its earlier events were handled by the
    # first replica.
    publish_steps(env, workload, range(2, 3))

    wait_drained(env, workload, reader)
    assert_invariants(env, workload, reader)

    owners = dict(env.query("SELECT partition, owner FROM consumer_offset"))
    assert set(owners.values()) == {"first", "second"}, owners
    assert first.alive()
    assert second.alive()
