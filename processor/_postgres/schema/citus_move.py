"""Moving a Citus schema's processes to another node (``saga-processor citus move-node``).

The node a schema's processes go through is pinned
(:func:`processor._postgres.schema.citus.pin_node`); moving it is an operator's decision, refused
while replicas of the schema still run elsewhere, and it raises the identity sequences of the new
node past the values the old one gave out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from processor._errors import ConfigurationError
from processor._postgres.schema.buckets import read_layout
from processor._postgres.schema.citus import (
    PinnedNode,
    distributed,
    local_node,
    pin_table,
    read_pin,
)

__all__ = ["MoveRefused", "NodeMove", "move_pin"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeMove:
    """What :func:`move_pin` did: the node before and after, and each sequence it raised."""

    before: PinnedNode | None
    after: PinnedNode
    raised: dict[str, int]


class MoveRefused(ConfigurationError):
    """The schema's processes cannot move to the connected node (the reason says why)."""

    def __init__(self, problem: str) -> None:
        super().__init__([problem])


def move_pin(
    conn: psycopg.Connection[Any],
    schema: str,
    actor: str,
    reason: str | None = None,
    *,
    lease_table: str | None = None,
) -> NodeMove:
    """Makes the connected node the one ``schema``'s processes use, in one transaction.

    The move is an operator's action: it enters the operators' trail (``operator_audit``) in
    the same transaction, under ``actor`` and ``reason``.

    Run with every process of the schema stopped: a process still connected through the old
    node would write beside the new ones. A replica still connected to any node of the cluster
    is found by its connections' name (``saga:`` and an instance id that owns a partition in
    the schema's positions or held the deadline lease in ``lease_table``), and the move is
    refused. Each identity sequence of the schema's tables is raised on this node above the
    largest id its table holds, so that rows written through this node sort after every older
    row, as the relay and the held records' replays need.

    Raises:
        MoveRefused: Not on Citus, the schema is not distributed (plain tables are on the
            coordinator alone; tables by bucket are reached through it), a replica of the
            schema is still connected, or a table holds ids above this node's range (a worker
            numbers from its group id times 2^48 up to the next group's start: a move to a
            worker of a lower group than the ids come from would reuse or reorder ids).
    """
    here = local_node(conn)
    if here is None:
        raise MoveRefused("the database is not a Citus node: there is no node to move to")
    with conn.transaction():
        if read_layout(conn, schema) is not None:
            # A worker holds some buckets only: a process through it would reach the others'
            # rows through it as well, and the deadline lease is the coordinator's alone.
            raise MoveRefused(
                f"schema {schema}'s tables are distributed by bucket over the workers: its "
                "processes connect through the coordinator, which sends each statement to the "
                "worker of its bucket"
            )
        if not distributed(conn, schema):
            raise MoveRefused(
                f"schema {schema} is not a Citus distributed schema: its tables are on the "
                "coordinator alone, where its processes connect"
            )
        running = _running(conn, schema, lease_table)
        if running:
            raise MoveRefused(
                f"processes of schema {schema} are still connected ("
                + ", ".join(f"{name} on {node}" for name, node in running)
                + "): stop every process of the schema, then move"
            )
        table = pin_table(schema)
        conn.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
        before = read_pin(conn, table)
        raised: dict[str, int] = {}
        for name, sequence, last, limit in conn.execute(_IDENTITIES, (schema,)).fetchall():
            top = conn.execute(
                sql.SQL("SELECT max(id) FROM {}.{}").format(
                    sql.Identifier(schema), sql.Identifier(name)
                )
            ).fetchone()
            highest = int(top[0]) if top and top[0] is not None else 0
            if highest >= int(limit):
                raise MoveRefused(
                    f"{schema}.{name} holds ids up to {highest}, above what {here[1]} (group "
                    f"{here[0]}) numbers ({limit} at most): move to a node of a higher group, "
                    "or to the coordinator"
                )
            if highest and (last is None or int(last) < highest):
                conn.execute("SELECT setval(%s, %s)", (sequence, highest))
                raised[name] = highest
        conn.execute(f"DELETE FROM {table}")
        conn.execute(
            f"INSERT INTO {table} (group_id, node, pinned_by) VALUES (%s, %s, %s)",
            (here[0], here[1], f"saga-processor citus-node move ({actor})"),
        )
        after = read_pin(conn, table)
        assert after is not None
        target = {
            "from": before.node if before else None,
            "to": after.node,
            "group": after.group_id,
            "raised": raised,
        }
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.operator_audit (actor, action, reason, target, outcome)"
                " VALUES (%s, 'citus-node-move', %s, %s, 'done')"
            ).format(sql.Identifier(schema)),
            (actor, reason, Jsonb(target)),
        )
    return NodeMove(before, after, raised)


def _running(
    conn: psycopg.Connection[Any], schema: str, lease_table: str | None
) -> list[tuple[str, str]]:
    """The sessions of the schema's replicas anywhere in the cluster, as (name, node).

    A replica is known by the instance ids that own the schema's partitions or held its deadline
    lease; its loops' connections are named ``saga:`` and its id.
    """
    offsets = '"' + schema.replace('"', '""') + '".consumer_offset'
    names: list[str] = []
    for table, column in ((offsets, "owner"), (lease_table, "holder")):
        if table is None:
            continue
        found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
        if found and found[0]:
            names.append(f"SELECT 'saga:' || {column} FROM {table} WHERE {column} IS NOT NULL")
    if not names:
        return []
    rows = conn.execute(
        "SELECT DISTINCT a.application_name, coalesce(n.nodename || ':' || n.nodeport,"
        " 'node ' || a.nodeid) FROM citus_stat_activity AS a"
        " LEFT JOIN pg_dist_node AS n ON n.nodeid = a.nodeid"
        f" WHERE a.application_name IN ({' UNION '.join(names)}) ORDER BY 1, 2"
    ).fetchall()
    return [(str(name), str(node)) for name, node in rows]


# The schema's tables with an identity column, with its sequence as this node numbers it (a
# worker's copy of a distributed table's sequence has its own range).
_IDENTITIES = """
SELECT c.relname, quote_ident(s.schemaname) || '.' || quote_ident(s.sequencename),
       s.last_value, s.max_value
  FROM pg_class AS c
  JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attidentity <> '' AND a.attname = 'id'
  JOIN pg_depend AS d ON d.refobjid = c.oid AND d.refobjsubid = a.attnum AND d.deptype = 'i'
  JOIN pg_class AS q ON q.oid = d.objid AND q.relkind = 'S'
  JOIN pg_sequences AS s ON s.schemaname = %s AND s.sequencename = q.relname
 WHERE c.relnamespace = to_regnamespace(s.schemaname) AND c.relkind IN ('r', 'p')
   AND c.oid IN (SELECT logicalrelid FROM pg_dist_partition)
 ORDER BY c.relname
"""
