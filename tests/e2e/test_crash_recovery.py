"""Replicas SIGKILLed around a commit or a relay round are replaced; effects stay exactly once."""

from __future__ import annotations

import signal
from collections import Counter
from typing import Any

import pytest

from tests.e2e.conftest import E2EEnv, assert_invariants, log_lines, publish_transfers, wait_drained
from tests.support.harness import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SAGAS = 100


@pytest.mark.parametrize("point", ["before-commit", "after-commit"])
def test_killed_replica_is_replaced_without_loss_or_double_effect(
    e2e_env: E2EEnv, point: str
) -> None:
    env = e2e_env
    reader = env.reader()
    workload = publish_transfers(env, SAGAS)
    # Batches of 20 over 300 records: the third batch is mid-stream, with sagas half done.
    fault = {"SAGA_FAULT_POINT": point, "SAGA_FAULT_AT": "3", "SAGA_FAULT_ACTION": "kill"}
    doomed = env.start("doomed", fault, consumer={"batch_size": 20})
    wait_until(lambda: not doomed.alive(), timeout=120, what=f"the kill at {point}")
    assert doomed.popen.returncode == -signal.SIGKILL
    assert log_lines(doomed, rf"fault: kill at {point} #3")
    # Before-commit the third batch never landed; after-commit it did, and its commands wait
    # in the outbox for the replacement's relay. Either way the replacement has work left.
    touched = {sid for (sid,) in env.query("SELECT DISTINCT saga_id FROM saga_history")}
    assert 0 < env.scalar("SELECT count(*) FROM saga_history") < workload.total

    env.start("replacement", consumer={"batch_size": 20})
    wait_drained(env, workload, reader)
    # The kill also hits the relay thread, which may be between producing a round and
    # deleting its rows: those commands go out again, under the same ids. Nothing else may.
    report = assert_invariants(env, workload, reader, duplicates_allowed=True)
    assert report.duplicated_sagas <= touched, report


def test_relay_killed_between_produce_and_delete_resends_under_the_same_ids(
    e2e_env: E2EEnv,
) -> None:
    env = e2e_env
    reader = env.reader()
    workload = publish_transfers(env, SAGAS)
    # Killed right after the broker acknowledged the relay's first round, before the round's
    # DELETE committed: those commands are on the topic and still in the outbox.
    fault = {"SAGA_FAULT_POINT": "after-produce", "SAGA_FAULT_AT": "1", "SAGA_FAULT_ACTION": "kill"}
    doomed = env.start("doomed", fault)
    wait_until(lambda: not doomed.alive(), timeout=120, what="the kill at after-produce")
    assert doomed.popen.returncode == -signal.SIGKILL
    assert log_lines(doomed, r"fault: kill at after-produce #1")
    reader.wait_for(lambda rs: len(rs) > 0, timeout=60, what="the killed round's commands")
    sent = {reader.headers(m)["message-id"] for m in reader.records}
    pending = {h["message-id"] for (h,) in env.query("SELECT headers FROM outbox")}
    assert sent <= pending, "an acknowledged command left the outbox although the round died"

    env.start("replacement")
    wait_drained(env, workload, reader)

    # Every command of the killed round goes out again, under its original message id.
    def resent(records: list[Any]) -> bool:
        copies = Counter(reader.headers(m)["message-id"] for m in records)
        return all(copies[mid] >= 2 for mid in sent)

    reader.wait_for(resent, timeout=60, what="the killed round's commands sent again")
    report = assert_invariants(env, workload, reader, duplicates_allowed=True)
    assert report.duplicates >= len(sent)
