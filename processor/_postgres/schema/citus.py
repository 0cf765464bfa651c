"""Citus: the processor's schema as a distributed schema of a Citus cluster.

Every table of the processor's schema lives in one Citus shard group, placed on one worker and
moved as a whole by Citus's rebalancer; clients connect to the coordinator, which routes each
statement to that worker. One statement touches only the schema's own tables, so each runs
on one worker, and a batch's transaction is a single-node transaction with the guarantees it
has on one PostgreSQL. Several processors (a schema each) spread over the workers.

Clients may also connect to the worker that holds the schema: Citus plans and runs the
statements there, and the coordinator has no part in a batch (S8 measures both). Three things
are per node, though: an identity column's values (a worker numbers from its group id times
2^48, the coordinator from 1), advisory locks, and LISTEN/NOTIFY. Every process of a schema must
therefore go through one node, or a saga's later outbox row could sort before an earlier one
and two relays could each hold "the" relay lock. :func:`pin_node` records the node a schema's
processes use, the first time one connects, and refuses a connection through any other.
Migrations are DDL, which Citus takes on the coordinator only: off it,
:func:`refuse_migrations_off_coordinator` stops a start whose schema is behind, with the way out.

The statements themselves are written for both: Citus refuses functions that are not immutable
inside a CASE, a coalesce or a conflict's clause of a modification (see the statements' comments),
and reports a worker's refusal of copied rows without its SQLSTATE
(:func:`processor._postgres.errors.citus_copy_sqlstate`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from processor._errors import ConfigurationError
from processor.settings._database import Distributed

log = logging.getLogger(__name__)

__all__ = [
    "DISTRIBUTE",
    "CitusNodeMismatch",
    "CitusUnavailable",
    "Distributed",
    "MigrationsOffCoordinator",
    "distribute_schema",
    "distributed",
    "local_node",
    "pin_node",
    "pin_table",
    "pinned_node",
    "placement",
    "read_pin",
    "refuse_migrations_off_coordinator",
    "use_citus",
    "will_distribute",
]


class CitusUnavailable(ConfigurationError):
    """Citus was asked for and the database does not have it: the process does not start."""

    def __init__(self, problem: str) -> None:
        super().__init__([problem])


class CitusNodeMismatch(ConfigurationError):
    """A connection reached another Citus node than the one the schema's processes use."""

    def __init__(self, schema: str, pinned: PinnedNode, here: tuple[int, str]) -> None:
        since = pinned.pinned_at.isoformat(sep=" ", timespec="seconds")
        super().__init__(
            [
                f"schema {schema} is used through Citus node {pinned.node} (group "
                f"{pinned.group_id}), first by {pinned.pinned_by} at {since}; this connection "
                f"reached {here[1]} (group {here[0]}). Identity "
                "values, advisory locks and notifications are per node, so every process of a "
                "schema connects through one node: use that node's address, or stop every "
                "process of the schema and move them all (docs/scaling.md, 'Through a worker')"
            ]
        )
        self.pinned = pinned
        self.here = here


class MigrationsOffCoordinator(ConfigurationError):
    """Migrations are pending and the connection is to a Citus worker, which refuses DDL."""

    def __init__(self, version_table: str, current: int, latest: int, node: str) -> None:
        super().__init__(
            [
                f"{version_table} is at {current} of {latest} migrations, and this connection "
                f"is to Citus worker {node}, where Citus refuses DDL: run `saga-processor "
                "migrate` with the coordinator's URL, then start through the worker"
            ]
        )


@dataclass(frozen=True)
class PinnedNode:
    """The Citus node a schema's processes connect through (see :func:`pin_node`)."""

    group_id: int
    node: str
    pinned_by: str
    pinned_at: datetime


def local_node(conn: psycopg.Connection[Any]) -> tuple[int, str] | None:
    """The Citus node this connection is on, as (group id, "host:port"); None without Citus.

    The coordinator's group is 0. The name is the one the cluster registered for the node
    (``group N`` if it registered none).
    """
    with conn.transaction():
        has = conn.execute("SELECT to_regclass('pg_catalog.pg_dist_local_group') IS NOT NULL")
        row = has.fetchone()
        if not row or not row[0]:
            return None
        found = conn.execute(
            """
            SELECT l.groupid,
                   (SELECT n.nodename || ':' || n.nodeport FROM pg_dist_node AS n
                     WHERE n.groupid = l.groupid ORDER BY n.nodeid LIMIT 1)
              FROM pg_dist_local_group AS l
            """
        ).fetchone()
    if found is None:
        return None
    group = int(found[0])
    return group, str(found[1]) if found[1] else f"group {group}"


def pin_node(conn: psycopg.Connection[Any], schema: str, who: str) -> PinnedNode | None:
    """Records this connection's Citus node as the schema's, or checks that it is the one.

    The first connection of any of the schema's processes records its node; every later one
    must be on the same node (see the module's docstring). Commits its own transaction.

    Args:
        conn: A new connection, not in a transaction.
        schema: The schema whose ``citus_node`` table holds the record.
        who: The connecting process, recorded with the node (its ``application_name``).

    Returns:
        The schema's node; None without Citus, or before the schema has the table (a schema
        still to be migrated).

    Raises:
        CitusNodeMismatch: The schema's processes use another node.
    """
    here = local_node(conn)
    if here is None:
        return None
    table = pin_table(schema)
    with conn.transaction():
        exists = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL, has_table_privilege(to_regclass(%s), 'INSERT')",
            (table, table),
        ).fetchone()
        if not exists or not exists[0]:
            return None
        pinned = read_pin(conn, table)
        if pinned is None:
            if not exists[1]:
                # A role that only reads (the console's) records nothing: reads do not depend
                # on the node, and the first process that writes records its own.
                return None
            conn.execute(
                f"INSERT INTO {table} (group_id, node, pinned_by) VALUES (%s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                (here[0], here[1], who),
            )
            pinned = read_pin(conn, table)
    if pinned is None:  # the row was removed between the two statements: record again
        return pin_node(conn, schema, who)
    if pinned.group_id != here[0]:
        raise CitusNodeMismatch(schema, pinned, here)
    return pinned


def pinned_node(conn: psycopg.Connection[Any], schema: str) -> PinnedNode | None:
    """The node recorded for ``schema`` by :func:`pin_node`; None if none is (or no table)."""
    table = pin_table(schema)
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
    if not exists or not exists[0]:
        return None
    return read_pin(conn, table)


def pin_table(schema: str) -> str:
    return '"' + schema.replace('"', '""') + '".citus_node'


def read_pin(conn: psycopg.Connection[Any], table: str) -> PinnedNode | None:
    row = conn.execute(f"SELECT group_id, node, pinned_by, pinned_at FROM {table}").fetchone()
    if row is None:
        return None
    return PinnedNode(int(row[0]), str(row[1]), str(row[2]), row[3])


def refuse_migrations_off_coordinator(
    conn: psycopg.Connection[Any], version_table: str, latest: int
) -> bool:
    """Whether ``conn`` is on a Citus worker, where migrations cannot run.

    Raises:
        MigrationsOffCoordinator: It is, and the schema is behind ``latest``.
    """
    here = local_node(conn)
    if here is None or here[0] == 0:
        return False
    with conn.transaction():
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (version_table,)).fetchone()
        current = 0
        if exists and exists[0]:
            row = conn.execute(f"SELECT coalesce(max(version), 0) FROM {version_table}").fetchone()
            current = int(row[0]) if row else 0
    if current < latest:
        raise MigrationsOffCoordinator(version_table, current, latest, here[1])
    return True


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
    if setting in ("citus", "buckets"):
        raise CitusUnavailable(
            f"SAGA_DATABASE__DISTRIBUTED is '{setting}', but the database has no citus extension: "
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
    layout = conn.execute("SELECT to_regclass(format('%%I.bucket_layout', %s::text))", (schema,))
    found = layout.fetchone()
    if found and found[0] is not None:
        return False  # distributed by bucket (schema/buckets.py): not plain tables
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
