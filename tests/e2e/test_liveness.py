"""A replica cut off from PostgreSQL (but not from Kafka) gives its partitions back to the
others within the bound and rejoins after healing, its relay and deadline poller working again;
a commit cut off in flight is resolved from the stored offsets. Nothing is lost or applied
twice."""

from __future__ import annotations

import re
import time
import urllib.request
from urllib.parse import urlsplit, urlunsplit

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
from tests.support.procs import ProcessorProcess
from tests.support.proxy import Proxy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SAGAS = 150
# Packets dropped for a minute: longer than every bound in play (the 20 s unavailable timeout,
# the 30 s TCP user timeout, the keepalives' ~25 s), so each has to act.
BLACK_HOLE = 60.0
# SAGA_CONSUMER__UNAVAILABLE_TIMEOUT (its default, 20 s) plus 10 s: the partitions go back, and
# the loops of a healed replica work again, within it.
BOUND = 30.0


def _via(proxy: Proxy, url: str) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username}:{parts.password}@127.0.0.1:{proxy.port}"
    # Plain text, so the proxy can tell a COMMIT when it sees one.
    query = "&".join(q for q in (parts.query, "sslmode=disable") if q)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _health(proc: ProcessorProcess) -> int:
    [port] = re.findall(r"/readyz on port (\d+)", proc.log())
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
        return int(response.status)


def _proxy_for(url: str) -> Proxy:
    parts = urlsplit(url)
    return Proxy((parts.hostname or "127.0.0.1", parts.port or 5432))


def test_a_replica_that_loses_the_database_hands_its_partitions_over_and_rejoins(
    e2e_env: E2EEnv,
) -> None:
    env = e2e_env
    proxy = _proxy_for(env.db)
    try:
        reader = env.reader()
        cut_off = env.start(
            "cut-off", database={"url": _via(proxy, env.db)}, consumer={"batch_size": 20}
        )
        wait_until(lambda: log_lines(cut_off, r"assigned \[\("), timeout=60, what="assignment")
        for name in ("steady-1", "steady-2"):
            env.start(name, consumer={"batch_size": 20})
        workload = new_workload(SAGAS)
        publish_steps(env, workload, range(1))
        wait_until(
            lambda: env.scalar("SELECT count(*) FROM saga_instance") == SAGAS,
            timeout=120,
            what="every saga started",
        )
        wait_until(
            lambda: (
                len(log_lines(cut_off, r"assigned \[\(")) >= 1
                and env.scalar(
                    "SELECT count(DISTINCT owner) FROM consumer_offset WHERE group_id = %s",
                    env.group_id,
                )
                == 3
            ),
            timeout=120,
            what="all three replicas owning partitions",
        )

        proxy.black_hole(drop=True)
        started = time.monotonic()
        publish_steps(env, workload, range(1, 3))
        # Its last commit was before the cut: the partitions go back within the bound of it.
        wait_until(
            lambda: log_lines(cut_off, r"giving this replica's partitions back to the group"),
            timeout=BOUND - (time.monotonic() - started),
            what="the cut-off replica giving its partitions back",
        )
        # The others finish everything, the cut-off replica's partitions included, while it
        # still cannot reach the database.
        wait_drained(env, workload, reader)
        drained_after = time.monotonic() - started
        assert drained_after < BLACK_HOLE, f"drained only after {drained_after:.0f} s"
        assert log_lines(cut_off, r"giving this replica's partitions back to the group")
        assert cut_off.alive()
        owners = {o for (o,) in env.query("SELECT DISTINCT owner FROM consumer_offset")}
        assert "cut-off" not in owners

        remaining = BLACK_HOLE - (time.monotonic() - started)
        if remaining > 0:
            time.sleep(remaining)  # the black hole lasts its full time, as a real partition
        proxy.heal()
        healed = time.monotonic()
        wait_until(
            lambda: log_lines(cut_off, r"answers again: rejoining the group"),
            timeout=BOUND,
            what="the cut-off replica rejoining",
        )
        # Its relay and deadline poller failed through the cut (their connections died with
        # it) and work again within the bound; health says every loop is alive.
        for loop in ("relay", "deadline poller"):
            pattern = rf"{loop} recovered after"
            wait_until(
                lambda pattern=pattern: log_lines(cut_off, pattern),  # type: ignore[misc]
                timeout=BOUND - (time.monotonic() - healed),
                what=f"the cut-off replica's {loop} working again",
            )
        assert _health(cut_off) == 200
        wait_until(
            lambda: (
                "cut-off" in {o for (o,) in env.query("SELECT DISTINCT owner FROM consumer_offset")}
            ),
            timeout=120,
            what="the cut-off replica owning partitions again",
        )
        assert_invariants(env, workload, reader, duplicates_allowed=True)
    finally:
        for proc in env.procs:
            proc.stop()
        proxy.close()


def test_a_commit_cut_off_in_flight_is_resolved_from_the_stored_offsets(
    e2e_env: E2EEnv,
) -> None:
    env = e2e_env
    proxy = _proxy_for(env.db)
    try:
        reader = env.reader()
        workload = new_workload(60)
        publish_steps(env, workload, range(3))
        # The batch's transaction inserts history and moves offsets: cut the connection of the
        # first three such transactions right after their COMMIT went to the server. (The
        # replica's other connection reads history and claims offsets, committing only the
        # claims: the insert's column list tells the two apart.)
        proxy.cut_commits(3, after=(b'"saga_history" (saga_type', b"consumer_offset"))
        replica = env.start(
            "replica", database={"url": _via(proxy, env.db)}, consumer={"batch_size": 20}
        )
        wait_drained(env, workload, reader)
        assert proxy.cut == 3
        unknown = log_lines(replica, r"commit outcome unknown")
        found = log_lines(replica, r"outcome found: (committed|not committed)")
        assert len(unknown) == 3, unknown
        assert len(found) == 3, found
        assert_invariants(env, workload, reader, duplicates_allowed=True)
    finally:
        for proc in env.procs:
            proc.stop()
        proxy.close()
