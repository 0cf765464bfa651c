"""SQL behind the console's cluster page: partition owners, the deadline lease, the relay's backlog.

Each count stops at a cap and each oldest row is the first entry of an index (the outbox's
(source_topic, source_partition, id), or its partial (id) index of rows of no source), so the
page costs the same with a million rows waiting as with none.
"""

from __future__ import annotations

import psycopg

from processor._ports.cluster import (
    ClusterView,
    DeadlineLease,
    PartitionRow,
    RelayBacklog,
    replicas_of,
)
from processor._postgres.connect import connect
from processor._postgres.deadlines import LEASE_NAME
from processor._postgres.held import Conn
from processor._postgres.schema.tables import Tables

__all__ = ["cluster_view", "database_answers"]

_PARTITIONS = """
    SELECT o.topic, o.partition, o.owner, o.owner_epoch, o.next_offset, o.updated_at,
           (SELECT count(*) FROM (SELECT 1 FROM {outbox}
             WHERE source_topic = o.topic AND source_partition = o.partition
             LIMIT %(cap)s) AS x),
           (SELECT now() - created_at FROM {outbox}
             WHERE source_topic = o.topic AND source_partition = o.partition
             ORDER BY id LIMIT 1)
      FROM {offsets} AS o WHERE o.group_id = %(group)s ORDER BY o.topic, o.partition
"""
_UNPARTITIONED = """
    SELECT (SELECT count(*) FROM (SELECT 1 FROM {outbox} WHERE source_topic IS NULL
             LIMIT %(cap)s) AS x),
           (SELECT now() - created_at FROM {outbox} WHERE source_topic IS NULL
             ORDER BY id LIMIT 1)
"""
# Failed rows are few unless something is badly wrong, and have no index by source: the
# first `cap` of them are grouped, so a flood costs the cap, not the flood.
_FAILED = """
    SELECT source_topic, source_partition, count(*) FROM (
        SELECT source_topic, source_partition FROM {failed_outbox} LIMIT %(cap)s) AS f
     GROUP BY source_topic, source_partition
"""
_LEASE = """
    SELECT holder, token, expires_at, expires_at - now() FROM {deadline_lock} WHERE name = %s
"""
# Replicas name their sessions `saga:<instance id>` (processor/_runtime/processor.py). Any role
# may read another session's application_name; the rest of its row needs pg_read_all_stats.
_CONNECTED = """
    SELECT substr(application_name, 6), count(*) FROM {activity}
     WHERE datname = current_database() AND application_name LIKE 'saga:%%'
     GROUP BY 1
"""


def _connected(conn: Conn) -> dict[str, int]:
    """Sessions per replica.

    On Citus the replicas may be connected to a worker rather than to this node (docs/scaling.md,
    "Through a worker"): they are counted over the whole cluster, where the role may ask.
    """
    citus = conn.execute("SELECT to_regclass('pg_catalog.citus_stat_activity') IS NOT NULL")
    found = citus.fetchone()
    if found and found[0]:
        try:
            return _count_sessions(conn, "citus_stat_activity")
        except psycopg.errors.InsufficientPrivilege:
            pass  # this node's sessions, as on one PostgreSQL
    return _count_sessions(conn, "pg_stat_activity")


def _count_sessions(conn: Conn, view: str) -> dict[str, int]:
    rows = conn.execute(_CONNECTED.format(activity=view)).fetchall()
    return {str(name): int(n) for name, n in rows}


def cluster_view(conn: Conn, tables: Tables, group_id: str, cap: int = 10_000) -> ClusterView:
    """The cluster page's data from the database (the lag is the broker's: see `with_lag`).

    Args:
        conn: An autocommit connection; the reads need no common snapshot.
        tables: Where the processor's tables live.
        group_id: The consumer group whose partitions are shown.
        cap: The most rows each count reads.
    """
    r = tables.render
    failed: dict[tuple[str | None, int | None], int] = {
        (t, p): int(n) for t, p, n in conn.execute(r(_FAILED), {"cap": cap}).fetchall()
    }
    partitions = [
        PartitionRow(
            str(topic),
            int(part),
            owner,
            int(epoch),
            stored,
            updated_at,
            RelayBacklog(int(pending), oldest, failed.pop((topic, part), 0)),
        )
        for topic, part, owner, epoch, stored, updated_at, pending, oldest in conn.execute(
            r(_PARTITIONS), {"cap": cap, "group": group_id}
        ).fetchall()
    ]
    found = conn.execute(r(_UNPARTITIONED), {"cap": cap}).fetchone()
    assert found is not None
    # Failed rows of no source, and of partitions this group does not own (another group's,
    # or a topic it no longer reads), are counted with the rows of no partition.
    unpartitioned = RelayBacklog(int(found[0]), found[1], sum(failed.values()))
    row = conn.execute(r(_LEASE), (LEASE_NAME,)).fetchone()
    lease = DeadlineLease(str(row[0]), int(row[1]), row[2], row[3]) if row is not None else None
    connected = _connected(conn)
    return ClusterView(
        group_id=group_id,
        replicas=replicas_of(partitions, connected, lease),
        partitions=partitions,
        lease=lease,
        unpartitioned=unpartitioned,
        cap=cap,
    )


def database_answers(url: str) -> bool:
    """Whether the database at ``url`` takes a connection and answers a query."""
    try:
        with connect(url, application_name="saga-processor-console", autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True
