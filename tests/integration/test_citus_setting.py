"""SAGA_DATABASE__DISTRIBUTED on a PostgreSQL without Citus: `auto` is plain, `citus` refuses."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest

from processor._postgres.connect import connect
from processor._postgres.reads.check import PostgresCheckSource
from processor._postgres.schema.citus import CitusUnavailable, local_node, pin_node
from processor._postgres.schema.citus_move import MoveRefused, move_pin
from processor._postgres.schema.tables import MIGRATIONS, Tables, migrate

pytestmark = pytest.mark.integration


@pytest.fixture
def plain(database_url: str) -> str:
    with psycopg.connect(database_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'").fetchone():
            pytest.skip("the test database has Citus: tests/citus covers it")
    return database_url


def tables_in(url: str, schema: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = %s", (schema,)
        ).fetchone()
    return int(row[0]) if row else 0


def test_auto_makes_plain_tables_without_citus(plain: str, pg_schema: str) -> None:
    with psycopg.connect(plain, autocommit=True) as conn:
        assert migrate(conn, Tables(pg_schema), "auto") == len(MIGRATIONS)
        # `check` has nothing to say of a distribution on a plain PostgreSQL.
        assert PostgresCheckSource(conn, Tables(pg_schema)).distribution() is None
    assert tables_in(plain, pg_schema) >= 14


def test_citus_asked_of_a_database_without_it_is_refused_and_creates_nothing(
    plain: str, pg_schema: str
) -> None:
    with psycopg.connect(plain, autocommit=True) as conn, pytest.raises(CitusUnavailable) as e:
        migrate(conn, Tables(pg_schema), "citus")
    assert "SAGA_DATABASE__DISTRIBUTED is 'citus'" in str(e.value)
    assert tables_in(plain, pg_schema) == 0

    # The command line says so in one line, exit code 2, as for any refused configuration.
    env = {
        **os.environ,
        "SAGA_DATABASE__URL": plain,
        "SAGA_DATABASE__SCHEMA_NAME": pg_schema,
        "SAGA_DATABASE__DISTRIBUTED": "citus",
        "SAGA_SAGAS": '["sagas"]',
    }
    done = subprocess.run(
        [sys.executable, "-m", "processor", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "the database has no citus extension" in done.stderr
    assert "Traceback" not in done.stderr


def test_without_citus_no_node_is_recorded_checked_or_movable(plain: str, pg_schema: str) -> None:
    tables = Tables(pg_schema)
    with psycopg.connect(plain, autocommit=True) as conn:
        migrate(conn, tables)
    # A process's connection on one PostgreSQL: nothing to pin, nothing recorded.
    with connect(plain, application_name="saga:r0", pin=pg_schema) as conn:
        assert local_node(conn) is None
        assert pin_node(conn, pg_schema, "saga:r0") is None
    with psycopg.connect(plain, autocommit=True) as conn:
        assert conn.execute(tables.render("SELECT count(*) FROM {citus_node}")).fetchone() == (0,)
        assert PostgresCheckSource(conn, tables).node_problem() is None
        with pytest.raises(MoveRefused) as refused:
            move_pin(conn, pg_schema, "ana")
    assert "not a Citus node" in str(refused.value)
