"""Processors on tables distributed by bucket, under load: growth, a killed replica, a shard move.

Which workers each of the processors' distributed transactions committed on is read from Citus
itself: ``pg_dist_transaction`` lists every two-phase commit by worker group, named after the
coordinator backend that ran it (``citus_<group>_<pid>_<transaction>_<n>``), and the backends
are the processors' own by their ``application_name``. A topic grown to a multiple of the
buckets keeps every transaction on one worker; grown to 9 from 6, some batches commit on both.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]
from psycopg import sql

from processor._postgres.connect import ensure_schema
from processor._postgres.schema.citus import Distributed
from processor._postgres.schema.tables import Tables
from tests.e2e.conftest import (
    E2EEnv,
    Workload,
    assert_invariants,
    new_workload,
    publish_steps,
    publish_transfers,
    wait_drained,
)
from tests.support.harness import create_topics, wait_until
from tests.support.tell import tell_if_failed

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BUCKETS = 6
SAGAS = 90
ON_BUCKETS = {"distributed": "buckets", "buckets": BUCKETS}
FAST = {"growth_check_interval": "500ms"}
# Batches of at most 50 records: how many batches, and so how many two-phase commits the test
# gets to check, no longer depends on how many records a busy machine lets each batch gather.
# With the default 500 the growth test saw 15 alone and 10 or 11 with the cores busy (one CI run
# failed its "more than 10"); with 50, 19 to 22 either way.
SMALL_BATCHES = {**FAST, "batch_size": 50}
_GID = re.compile(r"citus_(\d+)_(\d+)_(\d+)_\d+")


class TwoPhase:
    """The processors' batches' two-phase commits, by transaction: the worker groups each
    prepared on.

    Every prepared transaction is kept as it is seen; at the end only those of the processors'
    batch connections count. A batch store's connection is told apart from the replica's other
    connections (relay, poller, growth watch: the same ``application_name``) by what it was
    seen running once: a batch's inserts of saga or history rows, or its offsets' update.
    """

    _BATCH = r"INSERT INTO \S*(saga_history|saga_instance)|SET next_offset"

    def __init__(self, url: str, names: list[str]) -> None:
        self._url = url
        self._names = [f"saga:{n}" for n in names]
        self._seen: dict[tuple[str, str], set[int]] = defaultdict(set)
        self._batches: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> TwoPhase:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _sample(self) -> None:
        with psycopg.connect(self._url, autocommit=True) as conn:
            while not self._stop.wait(0.01):
                self._batches |= {
                    str(p)
                    for (p,) in conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE application_name = ANY(%s)"
                        " AND query ~ %s",
                        (self._names, self._BATCH),
                    ).fetchall()
                }
                for group, gid in conn.execute(
                    "SELECT groupid, gid FROM pg_dist_transaction"
                ).fetchall():
                    m = _GID.fullmatch(gid)
                    if m:
                        self._seen[(m.group(2), m.group(3))].add(int(group))

    @property
    def groups(self) -> dict[tuple[str, str], set[int]]:
        """The batches' transactions (backend pid, transaction number): their worker groups."""
        return {k: g for k, g in self._seen.items() if k[0] in self._batches}

    def spanning(self) -> int:
        """How many of the transactions committed on more than one worker."""
        return sum(len(g) > 1 for g in self.groups.values())


@pytest.fixture
def env(
    request: pytest.FixtureRequest, kafka_bootstrap: str, citus_url: str, tmp_path: Path
) -> Iterator[E2EEnv]:
    # The input topic's partition count: 6 (the buckets), or the test's (indirect parameter),
    # with the layout the schema starts in after it.
    partitions, first = cast(
        "tuple[int, Distributed]", getattr(request, "param", (BUCKETS, "buckets"))
    )
    prefix = f"b{uuid.uuid4().hex[:8]}."
    env = E2EEnv(
        kafka_bootstrap, citus_url, f"t_buckets_{prefix[1:-1]}", prefix, tmp_path, partitions
    )
    create_topics(kafka_bootstrap, [env.events_topic], partitions=env.partitions)
    create_topics(kafka_bootstrap, [env.commands_topic, prefix + "saga-dead-letters"], 3)
    ensure_schema(citus_url, Tables(env.schema), first, buckets=BUCKETS)
    try:
        yield env
    finally:
        for proc in env.procs:
            proc.stop()
        tell_if_failed(request, env.procs)
        for reader in env.readers:
            reader.close()
        with psycopg.connect(citus_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(env.schema))
            )


def grow(env: E2EEnv, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": env.kafka})
    for future in admin.create_partitions([NewPartitions(env.events_topic, partitions)]).values():
        future.result()
    wait_until(
        lambda: env.scalar("SELECT max(count) FROM partition_count") == partitions,
        timeout=60,
        what=f"the processors to see {partitions} partitions",
    )
    env.partitions = partitions


def test_a_topic_grown_to_a_multiple_under_load_keeps_every_transaction_on_one_worker(
    env: E2EEnv, citus_url: str
) -> None:
    names = [f"{env.prefix[:-1]}-r{n}" for n in range(2)]
    reader = env.reader()
    with TwoPhase(citus_url, names) as commits:
        for name in names:
            env.start(name, database=ON_BUCKETS, consumer=SMALL_BATCHES)
        before = publish_transfers(env, SAGAS)
        wait_drained(env, before, reader)
        # Under load: the sagas started before the growth get their replies after it.
        during = new_workload(SAGAS)
        publish_steps(env, during, range(1))
        grow(env, 12)
        publish_steps(env, during, range(1, 3))
        workload = Workload({**before.events, **during.events})
        wait_drained(env, workload, reader)
    assert_invariants(env, workload, reader, duplicates_allowed=True, grown=True)
    assert len(commits.groups) > 10, commits.groups
    assert commits.spanning() == 0, {k: g for k, g in commits.groups.items() if len(g) > 1}


@pytest.mark.parametrize("env", [(9, "buckets")], indirect=True)
def test_partitions_not_a_multiple_of_the_buckets_commit_on_two_workers_and_stay_exact(
    env: E2EEnv, citus_url: str
) -> None:
    # The growth watch refuses a growth to a count that is not a multiple of the old one (the
    # new partitions stay unconsumed: docs/operations.md), so this case arises when the bucket
    # count was set below the partition count: 9 partitions on 6 buckets. A partition's sagas
    # then fall in two buckets, which may live on both workers: those batches commit in two
    # phases over both, correctly.
    names = [f"{env.prefix[:-1]}-r{n}" for n in range(2)]
    reader = env.reader()
    with TwoPhase(citus_url, names) as commits:
        for name in names:
            env.start(name, database=ON_BUCKETS)
        workload = publish_transfers(env, SAGAS)
        wait_drained(env, workload, reader)
    assert_invariants(env, workload, reader, duplicates_allowed=True)
    assert commits.spanning() > 0, commits.groups


def test_three_replicas_one_killed_and_a_bucket_moved_under_load_lose_nothing(
    env: E2EEnv, citus_url: str
) -> None:
    names = [f"{env.prefix[:-1]}-r{n}" for n in range(3)]
    reader = env.reader()
    procs = [env.start(name, database=ON_BUCKETS) for name in names]
    before = publish_transfers(env, SAGAS)
    wait_drained(env, before, reader)

    during = new_workload(SAGAS * 2)
    publish_steps(env, during, range(1))
    procs[1].kill()
    with psycopg.connect(citus_url, autocommit=True) as conn:
        # Bucket 0's shard group to the other worker, under load; writes to it wait meanwhile.
        shard, host, port = conn.execute(
            "SELECT shardid, nodename, nodeport FROM citus_shards"
            " WHERE table_name = %s::regclass ORDER BY shardid LIMIT 1",
            (f"{env.schema}.saga_instance",),
        ).fetchone() or (None, None, None)
        assert shard is not None
        target = conn.execute(
            "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND nodeport <> %s"
            " ORDER BY nodeport LIMIT 1",
            (port,),
        ).fetchone()
        assert target is not None
        publish_steps(env, during, range(1, 2))
        conn.execute(
            "SELECT citus_move_shard_placement(%s, %s, %s, %s, %s,"
            " shard_transfer_mode => 'block_writes')",
            (shard, host, port, target[0], target[1]),
        )
        moved = conn.execute(
            "SELECT nodeport FROM citus_shards WHERE shardid = %s", (shard,)
        ).fetchone()
    assert moved is not None
    assert moved[0] == target[1]
    publish_steps(env, during, range(2, 3))
    workload = Workload({**before.events, **during.events})
    wait_drained(env, workload, reader)
    report = assert_invariants(env, workload, reader, duplicates_allowed=True)
    assert report.distinct == len(workload.events) * 2


@pytest.mark.parametrize(
    "env", [(BUCKETS, "off"), (BUCKETS, "citus")], indirect=True, ids=["plain", "schema"]
)
def test_sagas_in_flight_move_to_buckets_with_the_replicas_running_exactly_once(
    env: E2EEnv, citus_url: str, request: pytest.FixtureRequest
) -> None:
    # From plain tables on the coordinator, or from a distributed schema: the operator's
    # migrate moves them while both replicas go on, which take the new layout up on their own.
    first = request.node.callspec.params["env"][1]
    names = [f"{env.prefix[:-1]}-r{n}" for n in range(2)]
    reader = env.reader()
    workload = new_workload(SAGAS)
    procs = [env.start(name, database={"distributed": first}) for name in names]
    publish_steps(env, workload, range(2))
    wait_until(
        lambda: env.scalar("SELECT count(*) FROM saga_history") >= SAGAS,
        timeout=60,
        what="the sagas started",
    )
    ensure_schema(citus_url, Tables(env.schema), "buckets", buckets=BUCKETS, move=True)
    assert env.scalar("SELECT count(*) FROM bucket_layout") == 1
    publish_steps(env, workload, range(2, 3))
    wait_drained(env, workload, reader)
    report = assert_invariants(env, workload, reader, duplicates_allowed=True)
    assert report.distinct == len(workload.events) * 2
    # The same two processes throughout: none exited, and the batches after the move found it.
    assert all(proc.alive() for proc in procs)
    logs = "".join(proc.log() for proc in procs)
    assert "laid out anew" in logs
