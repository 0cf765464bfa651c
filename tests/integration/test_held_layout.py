"""A store's connection after an operator moved its tables to buckets under it.

Only a failure shows that the tables changed under statements made for the old ones; the held
connection then reads the layout again, and a changed one makes the failure ``Retryable`` on a
new connection (whose store makes its statements anew), not refused data that would set
records aside.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from processor._errors import RecordDataError, Retryable
from processor._postgres.connect import connect
from processor._postgres.held import HeldConnection
from processor._postgres.schema.buckets import LAYOUT_TABLE, layout_mark
from processor._postgres.schema.tables import Tables, migrate

pytestmark = pytest.mark.integration


def _refused(held: HeldConnection) -> Exception:
    try:
        with held.session() as conn, conn.transaction():
            conn.execute("SELECT 1 / 0")
    except (RecordDataError, Retryable) as e:
        return e
    raise AssertionError("the statement did not fail")


def test_a_failure_after_the_tables_were_laid_out_anew_is_retried_on_a_new_connection(
    database_url: str, pg_schema: str
) -> None:
    with psycopg.connect(database_url) as conn:
        migrate(conn, Tables(pg_schema), "off")
        conn.commit()
    held = HeldConnection(lambda: connect(database_url), layout=layout_mark(pg_schema))
    try:
        # The same layout: refused data stays refused data, on the same connection.
        assert isinstance(_refused(held), RecordDataError)
        assert held.opened == 1
        with psycopg.connect(database_url, autocommit=True) as other:
            # What a move to buckets leaves: the layout's table.
            other.execute(
                sql.SQL("CREATE TABLE {}.{} (one boolean)").format(
                    sql.Identifier(pg_schema), sql.Identifier(LAYOUT_TABLE)
                )
            )
        failure = _refused(held)
        assert isinstance(failure, Retryable)
        assert "laid out anew" in str(failure)
        # The next call opens a new connection, which reads the new layout as its own.
        assert isinstance(_refused(held), RecordDataError)
        assert held.opened == 2
    finally:
        held.close()
