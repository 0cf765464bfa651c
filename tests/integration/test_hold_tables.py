"""An operator's move locks every table of the schema at once, waiting out batches in flight."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from processor._postgres.schema.hold import hold_tables
from processor._postgres.schema.tables import Tables, migrate

pytestmark = pytest.mark.integration


def test_the_move_gives_its_locks_back_while_a_batch_holds_a_table_and_takes_them_after(
    database_url: str, pg_schema: str
) -> None:
    with psycopg.connect(database_url) as conn:
        migrate(conn, Tables(pg_schema), "off")
        conn.commit()
    instance = sql.SQL("{}.saga_instance").format(sql.Identifier(pg_schema))
    with psycopg.connect(database_url) as batch, psycopg.connect(database_url) as move:
        # A batch in flight: its transaction holds the saga table.
        batch.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(instance))
        with pytest.raises(RuntimeError, match="not granted in 3 attempts"):
            hold_tables(move, pg_schema, wait=0.1, attempts=3)
        # Each attempt gave back what it had taken: the batch goes on with the other tables.
        batch.execute(sql.SQL("SELECT count(*) FROM {}.outbox").format(sql.Identifier(pg_schema)))
        move.rollback()
        batch.commit()
        hold_tables(move, pg_schema, wait=0.1, attempts=3)
        held = move.execute(
            "SELECT count(*) FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation"
            " WHERE c.relnamespace = to_regnamespace(%s) AND l.pid = pg_backend_pid()"
            " AND l.mode = 'AccessExclusiveLock' AND c.relkind = 'r'",
            (pg_schema,),
        ).fetchone()
        tables = move.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = to_regnamespace(%s)"
            " AND relkind = 'r'",
            (pg_schema,),
        ).fetchone()
        assert held == tables
        # The session's own lock wait is back once the locks are held.
        assert move.execute("SHOW lock_timeout").fetchone() == ("0",)
        move.rollback()
