"""Citus: a distributed schema's tables brought back to the coordinator, to be distributed again.

Moving a processor from a distributed schema (``SAGA_DATABASE__DISTRIBUTED=citus``) to its
tables by bucket starts from plain tables, as the move from one PostgreSQL does. Citus's own way
back (``citus_schema_undistribute``) refuses tables with identity columns, and will not drop an
identity on a distributed table, while the outbox's and history's ids must survive: the relay
publishes a saga's commands in their order. So the tables are copied aside, dropped, the empty
schema undistributed, the tables made again by the migrations and their rows copied back with
their ids, all in the caller's transaction: a failure leaves the distributed schema as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from processor._postgres.schema.runner import VERSION_COLUMNS, split_statements

__all__ = ["undistribute"]

log = logging.getLogger(__name__)

# The node pin (schema/citus.py) names the node the schema's processes connected through; with
# the tables by bucket they connect through the coordinator, and the first one records it anew.
_NOT_COPIED = ("citus_node",)


def undistribute(
    conn: psycopg.Connection[Any], schema: str, steps: Sequence[str], version_table: str
) -> int:
    """Makes the distributed schema ``schema`` plain tables on the coordinator again.

    Rows, ids, owners and grants are kept; all in the caller's transaction.

    Args:
        conn: A connection to the coordinator, in a transaction, holding the migration lock.
        schema: A Citus distributed schema whose tables the migrations (``steps``, rendered)
            made, at the last step.
        steps: Every migration step of the schema, rendered.
        version_table: The qualified name of the table that records the versions applied.

    Returns:
        How many rows were copied.
    """
    names = [
        str(r[0])
        for r in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = to_regnamespace(%s)"
            " AND relkind = 'r' ORDER BY relname",
            (schema,),
        ).fetchall()
    ]
    grants = {name: _grants(conn, schema, name) for name in names}
    owners = dict(
        conn.execute(
            "SELECT relname, relowner::regrole::text FROM pg_class"
            " WHERE relnamespace = to_regnamespace(%s) AND relkind = 'r'",
            (schema,),
        ).fetchall()
    )
    for name in names:
        conn.execute(
            sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT * FROM {}").format(
                _aside(name), _q(schema, name)
            )
        )
    for name in names:
        conn.execute(sql.SQL("DROP TABLE {}").format(_q(schema, name)))
    # An empty distributed schema goes back to a plain one: what is created in it stays on the
    # coordinator.
    conn.execute("SELECT citus_schema_undistribute(to_regnamespace(%s))", (schema,))
    conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
    for step in steps:
        for statement in split_statements(step):
            conn.execute(statement)
    conn.execute(sql.SQL("RESET search_path"))
    conn.execute(f"CREATE TABLE IF NOT EXISTS {version_table} {VERSION_COLUMNS}")
    copied = 0
    for name in names:
        if name not in _NOT_COPIED:
            copied += _copy_back(conn, schema, name)
        conn.execute(
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(_q(schema, name), sql.SQL(owners[name]))
        )
        for grant in grants[name]:
            conn.execute(grant)
    log.info(
        "schema %s: the distributed schema's %d tables are plain tables on the coordinator "
        "again, %d rows copied with their ids",
        schema,
        len(names),
        copied,
    )
    return copied


def _copy_back(conn: psycopg.Connection[Any], schema: str, name: str) -> int:
    """Copies the rows set aside into the table made again; its identity goes on past them."""
    columns = [
        str(r[0])
        for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
            " AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
            (_q(schema, name).as_string(conn),),
        ).fetchall()
    ]
    listed = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    table = _q(schema, name)
    if name == "schema_version":
        # The migrations just made recorded nothing here; the versions are the old ones.
        conn.execute(sql.SQL("DELETE FROM {}").format(table))
    cursor = conn.execute(
        sql.SQL("INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT {} FROM {}").format(
            table, listed, listed, _aside(name)
        )
    )
    for (column,) in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attidentity <> ''",
        (table.as_string(conn),),
    ).fetchall():
        conn.execute(
            sql.SQL(
                "SELECT setval(pg_get_serial_sequence(%s, %s), coalesce(max({}), 0) + 1, false)"
                " FROM {}"
            ).format(sql.Identifier(column), table),
            (table.as_string(conn), column),
        )
    return max(cursor.rowcount, 0)


def _grants(conn: psycopg.Connection[Any], schema: str, name: str) -> list[sql.Composed]:
    """The GRANTs that give the table made again the privileges the old one had."""
    rows = conn.execute(
        """
        SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END,
               a.privilege_type, a.is_grantable
          FROM pg_class AS c, aclexplode(c.relacl) AS a
         WHERE c.oid = %s::regclass AND a.grantee <> c.relowner
        """,
        (_q(schema, name).as_string(conn),),
    ).fetchall()
    out = []
    for grantee, privilege, grantable in rows:
        to = sql.SQL("PUBLIC") if grantee == "PUBLIC" else sql.SQL(str(grantee))
        out.append(
            sql.SQL("GRANT {} ON TABLE {} TO {}{}").format(
                sql.SQL(str(privilege)),
                _q(schema, name),
                to,
                sql.SQL(" WITH GRANT OPTION" if grantable else ""),
            )
        )
    return out


def _q(schema: str, name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


def _aside(name: str) -> sql.Identifier:
    return sql.Identifier("pg_temp", f"undistributed_{name}")
