"""Citus: the processor's schema as a distributed schema of a Citus cluster.

Every table of the processor's schema lives in one Citus shard group, placed on one worker and
moved as a whole by Citus's rebalancer; clients connect to the coordinator, which routes each
statement to that worker. One statement touches only the schema's own tables, so each runs
on one worker, and a batch's transaction is a single-node transaction with the guarantees it
has on one PostgreSQL. Several processors (a schema each) spread over the workers.

The statements themselves are written for both: Citus refuses functions that are not immutable
inside a CASE, a coalesce or a conflict's clause of a modification (see the statements' comments),
and reports a worker's refusal of copied rows without its SQLSTATE
(:func:`processor.postgres.errors.citus_copy_sqlstate`).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from processor.errors import ConfigurationError
from processor.settings.database import Distributed

log = logging.getLogger(__name__)

__all__ = [
    "DISTRIBUTE",
    "CitusUnavailable",
    "Distributed",
    "distribute_schema",
    "distributed",
    "placement",
    "use_citus",
    "will_distribute",
]


class CitusUnavailable(ConfigurationError):
    """Citus was asked for and the database does not have it: the process does not start."""

    def __init__(self, problem: str) -> None:
        super().__init__([problem])


def installed(conn: psycopg.Connection[Any]) -> str | None:
    """The citus extension's version in the connected database; None without it."""
    row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'citus'").fetchone()
    return str(row[0]) if row else None


def use_citus(conn: psycopg.Connection[Any], setting: Distributed) -> bool:
    """Whether the schema is to be distributed with Citus, by the setting and the database."""
    if setting == "off":
        return False
    if installed(conn) is not None:
        return True
    if setting == "citus":
        raise CitusUnavailable(
            "SAGA_DATABASE__DISTRIBUTED is 'citus', but the database has no citus extension: "
            "CREATE EXTENSION citus on the coordinator (and each worker), or set it to 'off'"
        )
    return False


def distribute_schema(conn: psycopg.Connection[Any], schema: str, *, move: bool) -> bool:
    """Makes ``schema`` a distributed schema, in the caller's transaction; True if it does.

    An empty schema only gets its shard group: tables created in it later join it. A schema
    with tables (a processor moving from one PostgreSQL to Citus) has them moved to a worker,
    rows included, under locks that stop the processor's writes meanwhile: only with ``move``
    (``SAGA_DATABASE__DISTRIBUTED=citus``), never as a side effect of ``auto``.
    """
    if not will_distribute(conn, schema, move=move, warn=True):
        return False
    conn.execute(DISTRIBUTE, (schema,))
    return True


DISTRIBUTE = "SELECT citus_schema_distribute(to_regnamespace(%s))"
"""The statement that makes a schema distributed (the schema's name as its parameter)."""


def will_distribute(
    conn: psycopg.Connection[Any], schema: str, *, move: bool, warn: bool = False
) -> bool:
    """Whether :func:`distribute_schema` would distribute ``schema`` now (see there).

    Args:
        conn: A connection to the coordinator.
        schema: The processor's schema.
        move: Plain tables already in the schema are to be moved (the ``citus`` setting).
        warn: Log that plain tables stay where they are, when that is the reason for no.
    """
    if distributed(conn, schema):
        return False
    tables = conn.execute(
        "SELECT count(*) FROM pg_class WHERE relnamespace = to_regnamespace(%s)"
        " AND relkind IN ('r', 'p')",
        (schema,),
    ).fetchone()
    if tables and tables[0] and not move:
        if warn:
            log.warning(
                "schema %s holds plain tables on a Citus coordinator: they stay where they "
                "are; SAGA_DATABASE__DISTRIBUTED=citus moves them to a worker "
                "(docs/scaling.md)",
                schema,
            )
        return False
    return True


def distributed(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Whether ``schema`` is a Citus distributed schema (False without Citus)."""
    has_catalog = conn.execute("SELECT to_regclass('pg_catalog.pg_dist_schema') IS NOT NULL")
    row = has_catalog.fetchone()
    if not row or not row[0]:
        return False
    found = conn.execute(
        "SELECT 1 FROM pg_dist_schema WHERE schemaid = to_regnamespace(%s)", (schema,)
    )
    return found.fetchone() is not None


def placement(conn: psycopg.Connection[Any], schema: str) -> tuple[str, int] | None:
    """The worker (host, port) that holds ``schema``'s tables; None if it is not distributed."""
    row = conn.execute(
        """
        SELECT s.nodename, s.nodeport FROM citus_shards AS s
          JOIN pg_dist_schema AS d ON d.colocationid = s.colocation_id
         WHERE d.schemaid = to_regnamespace(%s)
         LIMIT 1
        """,
        (schema,),
    ).fetchone()
    return (str(row[0]), int(row[1])) if row else None
