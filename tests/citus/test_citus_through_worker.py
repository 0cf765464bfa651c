"""Processors connected to the Citus worker that holds their schema, not to the coordinator.

The coordinator then has no part in a batch (S8 measures it), and its outage stops nothing.
Identity values, advisory locks and notifications are per node, so the schema's processes must
all use one node: the first to connect records it (processor/_postgres/schema/citus.py: pin_node); a
replica, an operator tool or a participant that reaches another node is refused, saying which
node to use, and `check` fails such settings. `citus-node move` moves them all, with every
process stopped, keeping the ids in order. Migrations (DDL) go through the coordinator; a start
through the worker with migrations pending is refused, saying so. A rebalance that moves the
schema leaves its processes working through their node, and the console on the coordinator
sees them.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from devstack import CITUS
from processor._bootstrap.adapters import Adapters
from processor._cli import main
from processor._postgres.connect import connect, ensure_schema
from processor._postgres.reads.cluster import cluster_view
from processor._postgres.reads.operator import open_operator_queries
from processor._postgres.schema.citus import (
    CitusNodeMismatch,
    MigrationsOffCoordinator,
    pinned_node,
    placement,
)
from processor._postgres.schema.citus_move import MoveRefused, move_pin
from processor._postgres.schema.participant import (
    PARTICIPANT_MIGRATIONS,
    migrate_participant,
    migrate_service,
)
from processor._postgres.schema.tables import MIGRATIONS, Tables
from tests.citus.test_citus_worker_outage import local_workers
from tests.e2e.conftest import (
    TRANSFER_SAGA,
    E2EEnv,
    Workload,
    assert_invariants,
    log_lines,
    new_workload,
    publish_steps,
    publish_transfers,
    wait_drained,
)
from tests.support.harness import create_topics, wait_until
from tests.support.tell import tell_if_failed

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SAGAS = 40


def worker_url(citus_url: str, schema: str) -> tuple[str, int]:
    """The URL of the worker that holds ``schema`` (the coordinator's, with its host and port),
    and that worker's group id."""
    with psycopg.connect(citus_url, autocommit=True) as conn:
        where = placement(conn, schema)
        assert where is not None, f"{schema} is not a distributed schema"
        row = conn.execute(
            "SELECT groupid FROM pg_dist_node WHERE nodename = %s AND nodeport = %s", where
        ).fetchone()
    assert row is not None
    return reachable(make_conninfo(citus_url, host=where[0], port=str(where[1]))), int(row[0])


def reachable(url: str) -> str:
    """``url``, a worker's, if it answers from here; else the test is skipped.

    The coordinator knows the workers by the addresses they were registered with: in containers
    (devstack's testcontainers path) those are names on the containers' own network.
    """
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.OperationalError as e:
        pytest.skip(
            f"a worker's registered address does not answer from here ({e}): the tests "
            "through a worker need workers this machine reaches (the local cluster)"
        )
    return url


@pytest.fixture
def env(
    request: pytest.FixtureRequest, kafka_bootstrap: str, citus_url: str, tmp_path: Path
) -> Iterator[E2EEnv]:
    prefix = f"w{uuid.uuid4().hex[:8]}."
    schema = f"t_via_worker_{prefix[1:-1]}"
    ensure_schema(citus_url, Tables(schema))
    url, _ = worker_url(citus_url, schema)
    # The test reads through the coordinator; the processes connect to the worker.
    env = E2EEnv(
        kafka_bootstrap, citus_url, schema, prefix, tmp_path / "logs", partitions=6,
        process_db=url,
    )  # fmt: skip
    env.logs.mkdir()
    create_topics(kafka_bootstrap, [env.events_topic], partitions=env.partitions)
    create_topics(kafka_bootstrap, [env.commands_topic, prefix + "saga-dead-letters"], 3)
    try:
        yield env
    finally:
        for proc in env.procs:
            proc.stop()
        tell_if_failed(request, env.procs)
        for reader in env.readers:
            reader.close()
        with psycopg.connect(citus_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_replicas_through_the_worker_apply_every_event_once_and_move_to_the_coordinator(
    citus_url: str, env: E2EEnv, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, group = worker_url(citus_url, env.schema)
    reader = env.reader()
    through_worker = [env.start("r0"), env.start("r1")]
    done = publish_transfers(env, SAGAS)
    # Sagas that straddle the move below: two events through the worker, the third after.
    straddling = new_workload(SAGAS // 2)
    publish_steps(env, straddling, range(2))
    wait_drained(env, done, reader)

    with psycopg.connect(citus_url, autocommit=True) as conn:
        pinned = pinned_node(conn, env.schema)
    assert pinned is not None
    assert pinned.group_id == group
    # The first connection of a replica's start: its loops', or its operator queries' (a start
    # resumes parked sagas).
    assert pinned.pinned_by in {"saga:r0", "saga:r1", "saga-processor-ops"}
    # The worker numbers the rows inserted through it from its own range (group id times 2^48):
    # a row inserted through the coordinator would sort before them.
    assert env.scalar("SELECT min(id) FROM saga_history") >= group << 48

    # An operator tool through the coordinator is refused, and names the node to use.
    with pytest.raises(CitusNodeMismatch) as refused:
        open_operator_queries(citus_url, Tables(env.schema))
    assert pinned.node in str(refused.value)
    assert "(group 0)" in str(refused.value)

    # So is a replica through the coordinator: it exits, saying why, instead of running on.
    stray = E2EEnv(
        env.kafka, citus_url, env.schema, env.prefix, env.logs, env.partitions,
        process_db=citus_url,
    )  # fmt: skip
    proc = stray.start("stray")
    env.procs.append(proc)
    wait_until(lambda: not proc.alive(), timeout=60, what="the stray replica exits")
    assert proc.stop() != 0
    assert f"is used through Citus node {pinned.node}" in proc.log()
    assert all(p.alive() for p in through_worker)

    monkeypatch.setenv("SAGA_DATABASE__URL", citus_url)
    monkeypatch.setenv("SAGA_DATABASE__SCHEMA_NAME", env.schema)
    monkeypatch.setenv("SAGA_KAFKA__BOOTSTRAP_SERVERS", env.kafka)
    monkeypatch.setenv("SAGA_OPERATOR__NAME", "ana")
    monkeypatch.setenv("SAGA_SAGAS", json.dumps([TRANSFER_SAGA]))
    # The preflight check fails these settings: they reach the coordinator.
    capsys.readouterr()
    assert main(["check", "--skip-topics", "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert any(f"connect through {pinned.node}" in p for p in problems), problems

    # A move while the replicas run is refused, naming them and their node (a replica is known
    # by the partitions it owns or the lease it holds: both own some once the group settles).
    wait_until(
        lambda: (
            {o for (o,) in env.query("SELECT DISTINCT owner FROM consumer_offset")} == {"r0", "r1"}
        ),
        timeout=60,
        what="both replicas own partitions",
    )
    with pytest.raises(MoveRefused) as running:
        Adapters(env.settings()).move_citus_node("ana")
    assert f"saga:r0 on {pinned.node}" in str(running.value)
    assert f"saga:r1 on {pinned.node}" in str(running.value)

    # Every process stopped, `citus-node move` through the coordinator moves them there.
    for p in through_worker:
        assert p.stop() == 0
    capsys.readouterr()
    assert main(["citus-node", "move", "--reason", "off the worker", "--json"]) == 0
    moved = json.loads(capsys.readouterr().out)
    assert moved["before"]["node"] == pinned.node
    assert moved["after"]["group_id"] == 0
    highest = env.scalar("SELECT max(id) FROM saga_history")
    assert moved["raised"]["saga_history"] == highest
    assert main(["citus-node", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["pinned"]["group_id"] == shown["here"]["group"] == 0
    assert main(["check", "--skip-topics", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("its processes connect through" in n and "(the coordinator)" in n for n in notes)
    trail = env.query(
        "SELECT actor, action, reason, target->>'from', target->>'to' FROM operator_audit"
    )
    assert trail == [
        ("ana", "citus-node-move", "off the worker", pinned.node, moved["after"]["node"])
    ]

    # Through the coordinator now; the straddling sagas' last events land after their first
    # two in the history's id order, which the invariants read (and their offsets rise).
    env.procs.append(stray.start("r2"))
    publish_steps(env, straddling, range(2, 3))
    everything = Workload({**done.events, **straddling.events})
    wait_drained(env, everything, reader)
    assert_invariants(env, everything, reader)
    assert env.scalar("SELECT count(*) FROM saga_history WHERE id > %s", highest) == SAGAS // 2


# It stops the shared cluster's coordinator: no other test runs beside it.
@pytest.mark.serial
def test_processes_through_the_worker_go_on_while_the_coordinator_is_down(
    citus_url: str, env: E2EEnv
) -> None:
    local_workers(citus_url)  # stopping the coordinator needs the local cluster
    url, _ = worker_url(citus_url, env.schema)
    # The same world, read through the worker while the coordinator is away.
    on_worker = E2EEnv(env.kafka, url, env.schema, env.prefix, env.logs, env.partitions)
    reader = env.reader()
    replicas = [env.start("r0"), env.start("r1")]
    before = publish_transfers(env, SAGAS)
    wait_drained(env, before, reader)

    # The console, on the coordinator, sees the replicas connected to the worker.
    with psycopg.connect(citus_url, autocommit=True) as conn:
        view = cluster_view(conn, Tables(env.schema), env.group_id)
    assert {r.instance_id for r in view.replicas if r.connections} == {"r0", "r1"}

    subprocess.run([str(CITUS), "stop-coordinator"], check=True)
    try:
        during = publish_transfers(env, SAGAS)
        everything = Workload({**before.events, **during.events})
        # Every saga ends, every command is published, every offset is stored: batches, the
        # relay and the stored positions need nothing of the coordinator.
        wait_drained(on_worker, everything, reader)
    finally:
        subprocess.run([str(CITUS), "start-coordinator"], check=True)
    assert all(p.alive() for p in replicas)
    assert_invariants(env, everything, reader)
    for p in replicas:
        assert not log_lines(p, "WARNING|ERROR"), p.log()


def test_processes_through_the_old_worker_go_on_after_the_schema_moves_to_the_other(
    citus_url: str, env: E2EEnv
) -> None:
    reader = env.reader()
    replicas = [env.start("r0"), env.start("r1")]
    before = publish_transfers(env, SAGAS)
    wait_drained(env, before, reader)

    # A rebalance moves the schema under the running replicas (writes held during the copy).
    with psycopg.connect(citus_url, autocommit=True) as conn:
        old = placement(conn, env.schema)
        assert old is not None
        other = conn.execute(
            "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0"
            " AND (nodename, nodeport) <> (%s, %s) LIMIT 1",
            old,
        ).fetchone()
        assert other is not None
        conn.execute(
            "SELECT citus_schema_move(to_regnamespace(%s), %s, %s, 'block_writes')",
            (env.schema, other[0], other[1]),
        )
        assert placement(conn, env.schema) == (other[0], other[1])

    # Still connected to the old worker, which forwards their statements: nothing lost, nothing
    # applied twice, and the node they use has not changed.
    after = publish_transfers(env, SAGAS)
    everything = Workload({**before.events, **after.events})
    wait_drained(env, everything, reader)
    assert_invariants(env, everything, reader)
    assert all(p.alive() for p in replicas)
    with psycopg.connect(citus_url, autocommit=True) as conn:
        pinned = pinned_node(conn, env.schema)
    assert pinned is not None
    assert pinned.node == f"{old[0]}:{old[1]}"


def test_a_replica_whose_reconnection_reaches_another_node_stops_and_says_why(
    citus_url: str, env: E2EEnv
) -> None:
    url, _ = worker_url(citus_url, env.schema)
    reader = env.reader()
    replica = env.start("r0")
    done = publish_transfers(env, SAGAS // 4)
    wait_drained(env, done, reader)
    # As if the schema's processes had been moved to the coordinator under the running replica
    # (a URL that resolves elsewhere after a reconnection meets the same check).
    with psycopg.connect(citus_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE {}.citus_node SET group_id = 0, node = 'the coordinator'").format(
                sql.Identifier(env.schema)
            )
        )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'saga:r0'"
        )
    # Its loops reconnect, are refused, and the process stops rather than run on half alive.
    wait_until(lambda: not replica.alive(), timeout=60, what="the replica stops")
    assert replica.stop() == 70  # a loop died (processor._cli.commands.EXIT_LOOP_DIED)
    assert "is used through Citus node the coordinator (group 0)" in replica.log()


def test_a_move_to_a_worker_below_the_ids_written_is_refused(citus_url: str) -> None:
    schema = f"t_move_down_{uuid.uuid4().hex[:8]}"
    tables = Tables(schema)
    ensure_schema(citus_url, tables)
    try:
        with psycopg.connect(citus_url, autocommit=True) as conn:
            where = placement(conn, schema)
            assert where is not None
            nodes = conn.execute(
                "SELECT groupid, nodename, nodeport FROM pg_dist_node WHERE groupid <> 0"
                " ORDER BY groupid"
            ).fetchall()
            (_, low_host, low_port), (_, high_host, high_port) = nodes[0], nodes[-1]
            if where != (high_host, high_port):
                conn.execute(
                    "SELECT citus_schema_move(to_regnamespace(%s), %s, %s, 'block_writes')",
                    (schema, high_host, high_port),
                )
        high = reachable(make_conninfo(citus_url, host=high_host, port=str(high_port)))
        low = reachable(make_conninfo(citus_url, host=low_host, port=str(low_port)))
        with connect(high, application_name="t", pin=schema) as conn:
            conn.execute(
                tables.render(
                    'INSERT INTO {dead_letter} (topic, partition, "offset", headers, reason)'
                    " VALUES ('t', 0, 0, '{{}}', 'r')"
                )
            )
            conn.commit()
        with psycopg.connect(low, autocommit=True) as conn:
            with pytest.raises(MoveRefused) as refused:
                move_pin(conn, schema, "ana")
            assert f"{schema}.dead_letter holds ids up to" in str(refused.value)
            # Nothing moved.
            pinned = pinned_node(conn, schema)
            assert pinned is not None
            assert pinned.node == f"{high_host}:{high_port}"
    finally:
        with psycopg.connect(citus_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_a_start_through_the_worker_with_migrations_pending_is_refused_with_the_way_out(
    citus_url: str, env: E2EEnv
) -> None:
    url, _ = worker_url(citus_url, env.schema)
    with psycopg.connect(citus_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DELETE FROM {}.schema_version WHERE version = %s").format(
                sql.Identifier(env.schema)
            ),
            (len(MIGRATIONS),),
        )
    with pytest.raises(MigrationsOffCoordinator) as refused:
        ensure_schema(url, Tables(env.schema))
    message = str(refused.value)
    assert f"at {len(MIGRATIONS) - 1} of {len(MIGRATIONS)} migrations" in message
    assert "saga-processor migrate` with the coordinator's URL" in message


def test_a_participant_through_the_worker_migrates_nothing_there_and_pins_its_node(
    citus_url: str,
) -> None:
    schema = f"t_svc_worker_{uuid.uuid4().hex[:8]}"
    tables = Tables(schema)
    with psycopg.connect(citus_url, autocommit=True) as conn:
        migrate_participant(conn, tables)
    try:
        url, group = worker_url(citus_url, schema)
        with psycopg.connect(url, autocommit=True) as conn:
            # Current: a start through the worker finds nothing to do, and no DDL is sent.
            assert migrate_participant(conn, tables) == len(PARTICIPANT_MIGRATIONS)
            assert migrate_service(conn, tables, []) == 0
        with psycopg.connect(citus_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DELETE FROM {}.participant_schema_version WHERE version = %s").format(
                    sql.Identifier(schema)
                ),
                (len(PARTICIPANT_MIGRATIONS),),
            )
        with (
            psycopg.connect(url, autocommit=True) as conn,
            pytest.raises(MigrationsOffCoordinator),
        ):
            migrate_participant(conn, tables)
        # The service's connections pin the schema to the worker, as a processor's do.
        with connect(url, application_name="saga-participant", pin=schema):
            pass
        with psycopg.connect(citus_url, autocommit=True) as conn:
            pinned = pinned_node(conn, schema)
        assert pinned is not None
        assert (pinned.group_id, pinned.pinned_by) == (group, "saga-participant")
        with pytest.raises(CitusNodeMismatch):
            connect(citus_url, application_name="saga-participant", pin=schema)
    finally:
        with psycopg.connect(citus_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
