"""A replica frozen past its session timeout cannot apply anything twice when it wakes up."""

from __future__ import annotations

import signal

import pytest

from tests.e2e.conftest import (
    E2EEnv,
    assert_invariants,
    log_lines,
    publish_transfers,
    wait_drained,
)
from tests.support.harness import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SAGAS = 100


def _state(pid: int) -> str:
    # Field 3 of /proc/<pid>/stat; the command name before it is in parentheses.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize(
    "point",
    [
        # Frozen inside the batch's transaction, writes done and row locks held, COMMIT unsent:
        # the heir must get the locks without waiting for the zombie to wake. On Citus the
        # writes end with a pipeline, which leaves the server's idle timer stopped (psycopg's
        # flush request after the Sync): the heir's claim ends that session
        # (processor/_postgres/stuck.py).
        "before-commit",
        # Frozen mid-batch before writing it: on waking the zombie writes against stale
        # versions and an old epoch, which the saga-version and epoch CAS must refuse. The
        # batch before it may still be committing on the write lane when the process stops,
        # its rows locked, at times in the middle of sending a statement or inside its
        # pipeline, a session the server never ends on its own: the heir's claim ends it.
        "before-write",
    ],
)
def test_frozen_replica_is_fenced_out_and_never_double_applies(e2e_env: E2EEnv, point: str) -> None:
    env = e2e_env
    reader = env.reader()
    workload = publish_transfers(env, SAGAS)
    fault = {"SAGA_FAULT_POINT": point, "SAGA_FAULT_AT": "3", "SAGA_FAULT_ACTION": "stop"}
    # The relay may be frozen mid-round too, holding the relay lock: a short flush timeout
    # bounds how long the server lets that frozen round keep it.
    relay = {"flush_timeout": "5s"}
    zombie = env.start("zombie", fault, consumer={"batch_size": 20}, relay=relay)
    wait_until(lambda: _state(zombie.pid) == "T", timeout=120, what="the zombie to stop")
    assert 0 < env.scalar("SELECT count(*) FROM saga_history") < workload.total

    # The heir gets the partitions once the zombie's session times out, claims them (bumping
    # their epochs) and finishes everything while the zombie is still frozen.
    heir = env.start("heir", consumer={"batch_size": 20}, relay=relay)
    wait_drained(env, workload, reader)
    assert _state(zombie.pid) == "T", "the zombie must stay frozen while the heir drains"
    assert_invariants(env, workload, reader, duplicates_allowed=True)
    epochs = dict(env.query("SELECT partition, owner_epoch FROM consumer_offset"))
    assert len(epochs) == env.partitions
    assert all(e >= 2 for e in epochs.values()), epochs

    # Wake the zombie. It learns it lost the group, and whatever it still had in hand must be
    # refused rather than applied on top of the heir's work.
    zombie.signal(signal.SIGCONT)
    wait_until(lambda: log_lines(zombie, r"revoked \["), timeout=90, what="the zombie's revocation")
    # Refused (fenced), or in doubt and found to be of unknown outcome: its partitions have
    # a new owner who moved on, so the offsets no longer tell; either way nothing of it stands
    # on top of the heir's work, as the invariants below show.
    wait_until(
        lambda: log_lines(zombie, r"batch of \d+ records.*(not committed|outcome not known)"),
        timeout=60,
        what="the zombie's frozen batch to be refused",
    )
    # Nothing the zombie did after waking changed the outcome. (Repeats on the command topic
    # can only come from a relay round that was in flight when the zombie froze; they carry
    # the same ids and bytes, which assert_invariants checks.)
    assert_invariants(env, workload, reader, duplicates_allowed=True)
    assert heir.alive()
    assert zombie.alive()
    assert zombie.stop() == 0
    assert heir.stop() == 0
    assert_invariants(env, workload, reader, duplicates_allowed=True)
