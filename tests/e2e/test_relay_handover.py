"""Relaying moves with the input partitions: a replica SIGKILLed in a relay round while its
partitions are being handed over loses nothing, and each saga's commands stay in order."""

from __future__ import annotations

import signal
from typing import Any

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


def test_replica_killed_in_a_relay_round_during_a_hand_over(e2e_env: E2EEnv) -> None:
    env = e2e_env
    reader = env.reader()
    workload = new_workload(SAGAS)
    publish_steps(env, workload, range(1))
    # Small relay rounds, so that the replica is still relaying when the second one joins;
    # it dies in its fourth round, after the broker acknowledged it and before the DELETE.
    fault = {"SAGA_FAULT_POINT": "after-produce", "SAGA_FAULT_AT": "4", "SAGA_FAULT_ACTION": "kill"}
    small: dict[str, Any] = {
        "consumer": {"batch_size": 20},
        "relay": {"batch_size": 10, "poll_interval": "200ms"},
    }
    doomed = env.start("doomed", fault, **small)
    reader.wait_for(lambda rs: len(rs) > 0, timeout=60, what="the first replica's commands")
    # The second replica joins: half the partitions (and their relaying) move to it while the
    # first one is still publishing them.
    env.start("heir", **small)
    publish_steps(env, workload, range(1, 3))
    wait_until(lambda: not doomed.alive(), timeout=120, what="the kill at after-produce")
    assert doomed.popen.returncode == -signal.SIGKILL
    assert log_lines(doomed, r"fault: kill at after-produce #4")

    wait_drained(env, workload, reader)
    # Commands of the killed round go out again under the same ids; first occurrences of each
    # saga's commands are in saga order; nothing is lost.
    report = assert_invariants(env, workload, reader, duplicates_allowed=True)
    assert report.distinct == 2 * SAGAS
    # Both replicas relayed: the heir published rows of the partitions it took over.
    heir_epochs = env.query(
        "SELECT count(*) FROM consumer_offset WHERE group_id = %s AND owner = 'heir'",
        env.group_id,
    )
    assert heir_epochs[0][0] == env.partitions
