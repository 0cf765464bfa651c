"""A Citus worker stopped for 30 s under load: what lives on the other worker goes on.

Two processors, a schema each, placed on different workers. With the worker of one stopped,
the other keeps committing; the first gives its partitions back while its database does not
answer, and finishes once the worker is back. Both end with exactly the effects of their input:
nothing lost, nothing applied twice (the invariants of tests/e2e/conftest.py). And a COMMIT the
stopped worker never confirmed is tried again or resolved, never taken for a fatal error.

One processor on tables distributed by bucket over both workers: with one worker stopped, only
the sagas whose buckets it holds wait; those on the other worker end, and their commands are
sent, meanwhile.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from devstack import CITUS
from processor._engine.records import OffsetCommit, OutboxRow
from processor._engine.rows import (
    DeadlineInsert,
    HistoryRow,
    Outcome,
    SagaStatus,
    SagaWrite,
    WriteSet,
)
from processor._errors import CommitInDoubt, Failure, Retryable, RuntimeFailure
from processor._postgres.batch.handle import PostgresBatchStore
from processor._postgres.colocation import Colocation
from processor._postgres.connect import connect
from processor._postgres.deadlines import PostgresDeadlineStore
from processor._postgres.errors import translate
from processor._postgres.schema.buckets import read_layout
from processor._postgres.schema.citus import placement
from processor._postgres.schema.tables import Tables, migrate
from tests.citus.test_citus_buckets_load import ON_BUCKETS
from tests.citus.test_citus_buckets_load import env as bucket_env  # noqa: F401 (a fixture)
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

# It stops a node of the shared Citus cluster: no other test runs beside it.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.serial]

OUTAGE = 30.0
SAGAS = 60


def local_workers(citus_url: str) -> dict[int, int]:
    """The local cluster's workers (deploy/local/citus.sh), port to number; skips elsewhere."""
    url = subprocess.run([str(CITUS), "url"], check=True, capture_output=True, text=True)
    if url.stdout.strip() != citus_url:
        pytest.skip("stopping a worker needs the local Citus cluster (deploy/local/citus.sh)")
    with psycopg.connect(citus_url) as conn:
        ports = conn.execute(
            "SELECT nodeport FROM pg_dist_node WHERE groupid <> 0 ORDER BY nodeport"
        ).fetchall()
    return {int(port): n for n, (port,) in enumerate(ports, start=1)}


def worker(action: str, number: int) -> None:
    subprocess.run([str(CITUS), f"{action}-worker", str(number)], check=True)


@pytest.fixture
def two_envs(
    request: pytest.FixtureRequest, kafka_bootstrap: str, citus_url: str, tmp_path: Path
) -> Iterator[list[E2EEnv]]:
    envs = []
    for name in ("a", "b"):
        prefix = f"c{uuid.uuid4().hex[:8]}."
        env = E2EEnv(
            kafka_bootstrap, citus_url, f"t_outage_{name}_{prefix[1:-1]}", prefix,
            tmp_path / name, partitions=6,
        )  # fmt: skip
        env.logs.mkdir()
        create_topics(kafka_bootstrap, [env.events_topic], partitions=env.partitions)
        create_topics(kafka_bootstrap, [env.commands_topic, prefix + "saga-dead-letters"], 3)
        envs.append(env)
    try:
        yield envs
    finally:
        for env in envs:
            for proc in env.procs:
                proc.stop()
            tell_if_failed(request, env.procs)
            for reader in env.readers:
                reader.close()
        with psycopg.connect(citus_url, autocommit=True) as conn:
            for env in envs:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(env.schema))
                )


def test_the_other_workers_processor_commits_through_an_outage_and_nothing_is_lost(
    citus_url: str, two_envs: list[E2EEnv]
) -> None:
    workers = local_workers(citus_url)
    a, b = two_envs
    with psycopg.connect(citus_url, autocommit=True) as conn:
        for env in two_envs:
            migrate(conn, Tables(env.schema))
        where_a, where_b = placement(conn, a.schema), placement(conn, b.schema)
        assert where_a is not None
        assert where_b is not None
        if where_a == where_b:
            # Citus placed both on one worker: b moves to the other, writes blocked meanwhile.
            other = next(p for p in workers if p != where_a[1])
            conn.execute(
                "SELECT citus_schema_move(to_regnamespace(%s), %s, %s, 'block_writes')",
                (b.schema, where_a[0], other),
            )
            where_b = placement(conn, b.schema)
    assert where_b is not None
    assert where_a[1] != where_b[1]

    readers = {env.prefix: env.reader() for env in two_envs}
    for env in two_envs:
        env.start(f"{env.prefix[:-1]}-r0")
    before = {env.prefix: publish_transfers(env, SAGAS) for env in two_envs}
    for env in two_envs:
        wait_drained(env, before[env.prefix], readers[env.prefix])

    # Under load: requests keep coming to both while a's worker is away.
    during = {env.prefix: new_workload(SAGAS) for env in two_envs}
    stopped_at = time.monotonic()
    worker("stop", workers[where_a[1]])
    try:
        for env in two_envs:
            publish_steps(env, during[env.prefix], range(3))
        ended_b = SAGAS * 2
        wait_until(
            lambda: (
                b.scalar("SELECT count(*) FROM saga_instance WHERE status = 'ended'") == ended_b
            ),
            timeout=OUTAGE,
            what=f"b's {ended_b} sagas ended while a's worker is stopped",
        )
        # The fault lasts its whole length, whatever b took.
        wait_until(
            lambda: time.monotonic() - stopped_at >= OUTAGE, timeout=OUTAGE + 5, what="the outage"
        )
    finally:
        worker("start", workers[where_a[1]])

    for env in two_envs:
        workload = Workload({**before[env.prefix].events, **during[env.prefix].events})
        wait_drained(env, workload, readers[env.prefix])
        report = assert_invariants(env, workload, readers[env.prefix], duplicates_allowed=True)
        # A relay round cut by the outage may send a command again, with its id: never a
        # second effect (the invariants above), at most a repeat of the same record.
        assert report.distinct == len(workload.events) * 2


@pytest.mark.parametrize("rebalance", [False, True], ids=["one-replica", "rebalance"])
def test_on_buckets_a_stopped_worker_holds_back_only_the_sagas_whose_buckets_it_holds(
    citus_url: str,
    bucket_env: E2EEnv,  # noqa: F811 (the fixture imported above)
    rebalance: bool,
) -> None:
    """With ``rebalance``, a second replica joins while the worker is stopped: each replica's
    newly assigned partitions on the running worker are claimed and go on, those on the stopped
    one wait unclaimed, and neither replica gives its partitions back."""
    env = bucket_env
    workers = local_workers(citus_url)
    reader = env.reader()
    proc = env.start(f"{env.prefix[:-1]}-r0", database=ON_BUCKETS)
    before = publish_transfers(env, SAGAS)
    wait_drained(env, before, reader)
    with psycopg.connect(citus_url, autocommit=True) as conn:
        layout = read_layout(conn, env.schema)
        assert layout is not None
        where = Colocation()
        where.refresh(conn, layout, f"{env.schema}.saga_instance")

    def node(tid: str) -> str:
        return str(where.of_bucket(layout.of(tid)))

    during = new_workload(SAGAS)
    stopped = node(next(iter(during.events)))
    held = {tid for tid in during.events if node(tid) == stopped}
    going = set(during.events) - held
    assert held
    assert going, "every saga's bucket on one worker"
    going_buckets = sorted({layout.of(tid) for tid in going})

    def ended_going() -> int:
        return sum(
            env.scalar(
                "SELECT count(*) FROM saga_instance"
                " WHERE bucket = %s::int AND status = 'ended' AND saga_id = ANY(%s)",
                b,
                sorted(going),
            )
            for b in going_buckets
        )

    def sent_going(records: list[object]) -> bool:
        sent = {reader.headers(m).get("saga-id") for m in records}
        return going <= sent

    stopped_at = time.monotonic()
    worker("stop", workers[int(stopped.rsplit(":", 1)[1])])
    procs = [proc]
    try:
        if rebalance:
            procs.append(env.start(f"{env.prefix[:-1]}-r1", database=ON_BUCKETS))
        publish_steps(env, during, range(3))
        wait_until(
            lambda: ended_going() == len(going),
            timeout=OUTAGE,
            what=f"the {len(going)} sagas on the running worker ended while the other is stopped",
        )
        reader.wait_for(sent_going, timeout=OUTAGE, what="their commands sent meanwhile")
        # The fault lasts its whole length, whatever the others took.
        wait_until(
            lambda: time.monotonic() - stopped_at >= OUTAGE, timeout=OUTAGE + 5, what="the outage"
        )
        logs = [p.log_path.read_text() for p in procs]
        if not rebalance:
            assert "wait until it answers" in logs[0]
        assert all("giving this replica's partitions back" not in log for log in logs)
        if rebalance:
            # The joining replica was assigned partitions of the stopped worker's buckets.
            assert "their rows live on" in logs[1], "no claim met the stopped worker"
    finally:
        worker("start", workers[int(stopped.rsplit(":", 1)[1])])

    workload = Workload({**before.events, **during.events})
    wait_drained(env, workload, reader)
    report = assert_invariants(env, workload, reader, duplicates_allowed=True)
    assert report.distinct == len(workload.events) * 2
    assert "answers again" in proc.log_path.read_text()
    if rebalance:
        assert "answers again" in procs[1].log_path.read_text()


def test_on_buckets_a_stopped_worker_holds_back_only_its_buckets_deadlines(
    citus_url: str,
) -> None:
    """The lease stays on the coordinator: renewed, and the other worker's deadlines fire."""
    workers = local_workers(citus_url)
    schema = f"t_dl_{uuid.uuid4().hex[:8]}"
    tables = Tables(schema)
    with psycopg.connect(citus_url) as conn:
        migrate(conn, tables, "buckets", buckets=6)
        conn.commit()
        layout = read_layout(conn, schema)
        assert layout is not None
        where = Colocation()
        where.refresh(conn, layout, f"{schema}.saga_instance")
    # A saga whose bucket is on each worker.
    one: dict[str, str] = {}
    for i in range(100):
        one.setdefault(str(where.of_bucket(layout.of(f"s{i}"))), f"s{i}")
    assert len(one) == 2
    stopped, going = sorted(one)
    store = PostgresBatchStore(lambda: connect(citus_url), tables, "g")
    deadlines = PostgresDeadlineStore(lambda: connect(citus_url), tables)
    try:
        due = datetime.now(UTC) - timedelta(seconds=1)
        store.write(
            WriteSet(
                deadline_inserts=[
                    DeadlineInsert(str(uuid.uuid4()), "dl-saga", sid, "t", due, None, "in", 0)
                    for sid in one.values()
                ]
            ),
            [],
        )
        worker("stop", workers[int(stopped.rsplit(":", 1)[1])])
        try:
            token = deadlines.acquire("p1", 30.0)
            assert token is not None, "the lease could not be taken with a worker stopped"
            assert deadlines.acquire("p1", 30.0, token) == token, "nor renewed"
            fired, again_in = deadlines.claim_due("p1", token, 100, full=True)
            assert [r.saga_id for r in fired] == [one[going]]
            assert again_in is not None
        finally:
            worker("start", workers[int(stopped.rsplit(":", 1)[1])])

        def rest() -> list[str] | None:
            try:
                rows, _ = deadlines.claim_due("p1", token, 100, full=False)
            except RuntimeFailure:
                return None  # the worker does not answer yet
            return [r.saga_id for r in rows] or None

        assert wait_until(rest, timeout=60, what="the stopped worker's deadline") == [one[stopped]]
    finally:
        store.close()
        deadlines.close()
        with psycopg.connect(citus_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_a_commit_the_schemas_worker_does_not_confirm_is_tried_again_not_fatal(
    citus_url: str,
) -> None:
    """The worker stops between a transaction's statements and its COMMIT.

    The coordinator reports that COMMIT under XX000 (a lost PREPARE of copied rows from the
    function that relays a worker's result; a lost one-phase COMMIT from its own), which read as
    "fatal" would stop the replica; a batch's comes back as worth another try, a one-phase
    commit's as in doubt, and the batch commits once the worker is back.
    """
    workers = local_workers(citus_url)
    schema = f"t_commit_{uuid.uuid4().hex[:8]}"
    tables = Tables(schema)
    with psycopg.connect(citus_url, autocommit=True) as conn:
        migrate(conn, tables)
        where = placement(conn, schema)
    assert where is not None
    number = workers[where[1]]
    store = PostgresBatchStore(lambda: connect(citus_url), tables, "commit-group")
    try:
        store.claim([("in", 0)], "r0")
        # A batch (its rows copied to the worker: a two-phase commit there).
        with pytest.raises(RuntimeFailure) as batch:
            store.write(
                one_saga(0), [OffsetCommit("in", 0, 1, None, 1)],
                before_commit=lambda: worker("stop", number),
            )  # fmt: skip
        worker("start", number)
        assert batch.value.kind is Failure.RETRYABLE, batch.value
        stored = wait_until(lambda: answers(store), timeout=60, what="the worker to answer")
        assert stored == {("in", 0): (1, None)}  # not committed
        store.write(one_saga(0), [OffsetCommit("in", 0, 1, None, 1)])
        assert store.read_offsets([("in", 0)]) == {("in", 0): (1, 1)}

        # A one-phase commit (an update of rows already there).
        with connect(citus_url) as conn:
            conn.execute(
                sql.SQL("UPDATE {}.consumer_offset SET owner = 'r1'").format(sql.Identifier(schema))
            )
            worker("stop", number)
            try:
                with pytest.raises(psycopg.Error) as commit:
                    conn.commit()
            finally:
                worker("start", number)
        assert isinstance(translate(commit.value), CommitInDoubt), commit.value
    finally:
        store.close()
        with psycopg.connect(citus_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def one_saga(n: int) -> WriteSet:
    sid = f"s{n}"
    return WriteSet(
        sagas=[SagaWrite("commit-saga", sid, {"n": n}, SagaStatus.ACTIVE, 1, None, None)],
        history=[
            HistoryRow(
                "commit-saga", sid, f"m{n}", "Started", "event", Outcome.APPLIED, 1, "in", 0, n
            )
        ],
        outbox=[OutboxRow("commit-saga", sid, "out", b"k", {}, b"v", None, ("in", 0))],
    )


def answers(store: PostgresBatchStore) -> dict[tuple[str, int], tuple[int, int | None]] | None:
    """The stored offsets, or None while the worker does not answer yet."""
    try:
        return store.read_offsets([("in", 0)])
    except Retryable:
        return None
