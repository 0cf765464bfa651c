"""The processor's schema on Citus: one distributed schema, every statement on its worker.

A batch is a transaction on the worker that holds the schema alone: the coordinator sends every
statement of it there and commits it there (seen in the remote commands Citus logs).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from processor._engine.records import OffsetCommit, OutboxRow
from processor._engine.rows import HistoryRow, Outcome, SagaStatus, SagaWrite, Wants, WriteSet
from processor._errors import RecordDataError
from processor._postgres.batch import sql as batch_sql
from processor._postgres.batch.handle import PostgresBatchStore
from processor._postgres.connect import connect
from processor._postgres.errors import translate
from processor._postgres.reads.check import PostgresCheckSource
from processor._postgres.schema.citus import placement, will_distribute
from processor._postgres.schema.participant import migrate_participant, migrate_service
from processor._postgres.schema.runner import split_statements
from processor._postgres.schema.tables import MIGRATIONS, Tables, migrate, pending_sql

pytestmark = pytest.mark.integration

SAGA = "citus-saga"


@pytest.fixture
def schema(citus_url: str) -> Iterator[str]:
    name = f"t_citus_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(citus_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def tables_of(conn: psycopg.Connection[Any], schema: str) -> dict[str, tuple[str, int]]:
    """Each table of ``schema`` that Citus knows: its kind and its co-location group."""
    rows = conn.execute(
        "SELECT table_name::text, citus_table_type, colocation_id FROM citus_tables"
        " WHERE table_name::text LIKE %s",
        (f"{schema}.%",),
    ).fetchall()
    return {name.split(".", 1)[1]: (kind, int(group)) for name, kind, group in rows}


def write_batch(store: PostgresBatchStore, n: int, expected: int | None) -> None:
    sid = f"s{n}"
    store.write(
        WriteSet(
            sagas=[SagaWrite(SAGA, sid, {"n": n}, SagaStatus.ACTIVE, 1, None, None)],
            history=[
                HistoryRow(SAGA, sid, f"m{n}", "Started", "event", Outcome.APPLIED, 1, "in", 0, n)
            ],
            outbox=[OutboxRow(SAGA, sid, "out", b"k", {}, b"v", None, ("in", 0))],
        ),
        [OffsetCommit("in", 0, n + 1, expected, 1)],
    )


def test_every_table_of_the_schema_is_in_one_shard_group_on_a_worker(
    citus_url: str, schema: str
) -> None:
    with psycopg.connect(citus_url, autocommit=True) as conn:
        assert migrate(conn, Tables(schema)) == len(MIGRATIONS)
        found = tables_of(conn, schema)
        worker = placement(conn, schema)
        coordinator = conn.execute(
            "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid = 0"
        ).fetchone()

    assert set(found) >= {
        "saga_instance", "saga_history", "outbox", "failed_outbox", "saga_deadline",
        "saga_deadline_lock", "consumer_offset", "dead_letter", "parked_message",
        "saga_tombstone", "partition_count", "partition_growth", "operator_audit",
        "schema_version",
    }  # fmt: skip
    assert {kind for kind, _ in found.values()} == {"schema"}
    assert len({group for _, group in found.values()}) == 1
    assert worker is not None
    assert coordinator is not None
    assert worker != (coordinator[0], int(coordinator[1]))


def test_a_batch_is_one_transaction_on_the_schemas_worker_alone(
    citus_url: str, schema: str
) -> None:
    tables = Tables(schema)
    with psycopg.connect(citus_url, autocommit=True) as conn:
        migrate(conn, tables)
        worker = placement(conn, schema)
    assert worker is not None
    remote: list[tuple[str, str]] = []

    def logged(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        # Citus logs each command it sends to a node, and on which node, as a LOG message.
        conn.execute("SET citus.log_remote_commands = on")
        conn.execute("SET client_min_messages = log")
        conn.commit()
        conn.add_notice_handler(
            lambda d: remote.append((d.message_primary or "", d.message_detail or ""))
        )
        return conn

    store = PostgresBatchStore(lambda: logged(connect(citus_url)), tables, "citus-group")
    try:
        store.claim([("in", 0)], "r0")
        remote.clear()
        write_batch(store, 0, None)
        store.load(Wants({(SAGA, "s0")}, set(), set()))
    finally:
        store.close()

    nodes = {
        m.group(1) for _, detail in remote if (m := re.search(r"on server \S+@(\S+?) ", detail))
    }
    commands = [message for message, _ in remote]
    assert nodes == {f"{worker[0]}:{worker[1]}"}, remote
    assert any("saga_instance" in c for c in commands), commands
    # Citus commits rows it copied to a worker in two phases, even on one worker: prepared
    # and committed there, and nowhere else.
    assert any(c.startswith("issuing COMMIT PREPARED") or c == "issuing COMMIT" for c in commands)


def test_the_hot_statements_are_router_plans_on_the_schemas_worker(
    citus_url: str, schema: str
) -> None:
    tables = Tables(schema)
    keys = json.dumps([[SAGA, "s1"]])
    cases: list[tuple[str, list[Any]]] = [
        (batch_sql.LOAD_SAGAS, [keys]),
        (batch_sql.LOAD_APPLIED, [json.dumps([[SAGA, "s1", "m1"]])]),
        (batch_sql.UPDATE_SAGAS, [json.dumps([[SAGA, "s1", {}, "active", 2, None, 1, None, 1]])]),
        (batch_sql.CLEAR_DEADLINES, [keys]),
    ]
    with psycopg.connect(citus_url, autocommit=True) as conn:
        migrate(conn, tables)
        worker = placement(conn, schema)
        assert worker is not None
        for template, params in cases:
            plan = conn.execute("EXPLAIN (FORMAT JSON) " + tables.render(template), params)
            row = plan.fetchone()
            assert row is not None
            job = row[0][0]["Plan"]["Distributed Query"]["Job"]
            assert job["Task Count"] == 1, template
            assert job["Tasks"][0]["Node"].startswith(f"host={worker[0]} port={worker[1]} "), (
                template
            )


def test_a_schema_from_one_postgresql_is_distributed_with_its_rows(
    citus_url: str, schema: str
) -> None:
    # A processor moving to Citus: its tables were made as plain ones (distributed "off"), and
    # the next start with Citus distributes the schema, rows and positions included.
    tables = Tables(schema)
    with psycopg.connect(citus_url, autocommit=True) as conn:
        migrate(conn, tables, "off")
        assert tables_of(conn, schema) == {}
    store = PostgresBatchStore(lambda: connect(citus_url), tables, "citus-group")
    try:
        store.claim([("in", 0)], "r0")
        write_batch(store, 0, None)
    finally:
        store.close()

    with psycopg.connect(citus_url, autocommit=True) as conn:
        migrate(conn, tables, "citus")
        assert {kind for kind, _ in tables_of(conn, schema).values()} == {"schema"}
    store = PostgresBatchStore(lambda: connect(citus_url), tables, "citus-group")
    try:
        # The stored position holds across the move: the next batch's compare-and-set passes.
        assert store.read_offsets([("in", 0)]) == {("in", 0): (1, 1)}
        write_batch(store, 1, 1)
        loaded = store.load(Wants({(SAGA, "s0"), (SAGA, "s1")}, set(), set()))
    finally:
        store.close()
    assert set(loaded.sagas) == {(SAGA, "s0"), (SAGA, "s1")}


def test_auto_leaves_a_schema_of_plain_tables_where_it_is(citus_url: str, schema: str) -> None:
    # Moving a processor's rows to a worker holds its writes for the copy: never a side effect
    # of the default, only when asked for ("citus").
    with psycopg.connect(citus_url, autocommit=True) as conn:
        migrate(conn, Tables(schema), "off")
        migrate(conn, Tables(schema), "auto")
        assert tables_of(conn, schema) == {}
        migrate(conn, Tables(schema), "citus")
        assert {kind for kind, _ in tables_of(conn, schema).values()} == {"schema"}


def test_the_reviewed_ddl_distributes_the_schema_and_check_names_its_worker(
    citus_url: str, schema: str
) -> None:
    # `migrate --sql` prints what `migrate` would run, distribution included; a DBA who applies
    # it by hand (a statement at a time, as psql sends them) gets the same distributed schema.
    tables = Tables(schema)
    with psycopg.connect(citus_url, autocommit=True) as conn:
        assert will_distribute(conn, schema, move=False)
        ddl = pending_sql(0, tables, distribute=True)
        assert "citus_schema_distribute" in ddl
        with conn.transaction():
            for statement in split_statements(ddl):
                conn.execute(statement)
        assert {kind for kind, _ in tables_of(conn, schema).values()} == {"schema"}
        assert not will_distribute(conn, schema, move=True)
        worker = placement(conn, schema)
        assert worker is not None
        where = PostgresCheckSource(conn, tables).distribution()
    assert where is not None
    assert f"distributed schema on {worker[0]}:{worker[1]}" in where


def test_check_says_a_schema_of_plain_tables_stays_on_the_coordinator(
    citus_url: str, schema: str
) -> None:
    tables = Tables(schema)
    with psycopg.connect(citus_url, autocommit=True) as conn:
        migrate(conn, tables, "off")
        # `auto` leaves it (see above); `citus` would move it, and its reviewed DDL says so.
        assert not will_distribute(conn, schema, move=False)
        assert will_distribute(conn, schema, move=True)
        where = PostgresCheckSource(conn, tables).distribution()
    assert where is not None
    assert "plain tables on a Citus" in where
    assert "SAGA_DATABASE__DISTRIBUTED=citus" in where


def test_a_participants_tables_and_its_services_own_share_one_worker(
    citus_url: str, schema: str
) -> None:
    # A command's transaction writes the inbox, the outbox, the position and the service's own
    # rows: all in the schema's shard group, so it runs on one worker. The service's migration
    # has several statements in one step, which Citus's workers take one at a time.
    own = """
    CREATE TABLE ledger (account text PRIMARY KEY, balance numeric NOT NULL,
                         CONSTRAINT no_overdraft CHECK (balance >= 0));
    CREATE INDEX ledger_balance_idx ON ledger (balance);
    """
    tables = Tables(schema)
    with psycopg.connect(citus_url, autocommit=True) as conn:
        migrate_participant(conn, tables)
        assert migrate_service(conn, tables, [own]) == 1
        found = tables_of(conn, schema)
        worker = placement(conn, schema)
    assert set(found) >= {"inbox", "outbox", "failed_outbox", "consumer_offset", "ledger"}
    assert {kind for kind, _ in found.values()} == {"schema"}
    assert len({group for _, group in found.values()}) == 1
    assert worker is not None


@pytest.mark.parametrize(
    "insert",
    [
        "INSERT INTO {t} VALUES ('a', -1)",  # routed to the worker
        "INSERT INTO {t} SELECT 'b', -1",  # copied to the worker
    ],
)
def test_a_workers_refusal_names_the_table_not_its_shard(
    citus_url: str, schema: str, insert: str
) -> None:
    table = f'"{schema}".holds'
    with psycopg.connect(citus_url, autocommit=True) as conn:
        migrate_participant(conn, Tables(schema))
        conn.execute(
            f"CREATE TABLE {table} (id text PRIMARY KEY, amount numeric NOT NULL,"
            " CONSTRAINT no_held CHECK (amount >= 0))"
        )
        with pytest.raises(psycopg.Error) as raised:
            conn.execute(insert.format(t=table))
    failure = translate(raised.value)
    assert isinstance(failure, RecordDataError)
    assert failure.sqlstate == "23514"
    assert 'relation "holds" violates check constraint "no_held"' in str(failure)
