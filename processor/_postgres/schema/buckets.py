"""Citus, distributed by bucket: one processor's tables spread over several workers.

With ``SAGA_DATABASE__DISTRIBUTED=buckets`` the processor's schema is not a distributed schema
(one shard group, one worker) but a set of hash-distributed tables, co-located by a ``bucket``
column (:mod:`processor._engine.buckets`): a saga's rows, and a partition's offsets and dead
letters, share one shard group, and the groups spread over the workers. Every primary key and
unique index leads with the bucket; the statements of the hot path carry it, so Citus routes
each to one worker. Tables written rarely or read whole (the versions, the partition counts
and growths, the operators' trail, the node pin, the layout) are reference tables; the deadline
lease, renewed every few seconds, stays a plain table on the coordinator, so that a stopped
worker does not stop the lease's renewal.

The tables are made by the same migrations as everywhere, then :func:`bucketize` adds the
column, re-keys them and distributes them, in the migration's transaction. It records the
layout (:data:`LAYOUT_TABLE`): the bucket count, the partitioner, and each bucket's key, chosen
so that each bucket is a shard of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql

from processor._engine.buckets import Buckets
from processor._engine.partitioner import Partitioner, normalise
from processor._errors import ConfigurationError

__all__ = [
    "BY_BUCKET",
    "LAYOUT_TABLE",
    "ON_COORDINATOR",
    "REFERENCE",
    "BucketLayoutMismatch",
    "bucketize",
    "checked_layout",
    "distribute_by_bucket",
    "layout_mark",
    "read_layout",
]

LAYOUT_TABLE = "bucket_layout"

# Each saga table, the primary key after the bucket, and where an existing row's bucket comes
# from: its saga, else the input partition it came from (offsets, dead letters, rows of no saga).
BY_BUCKET: dict[str, str] = {
    "saga_instance": "saga_type, saga_id",
    "saga_history": "id",
    "outbox": "id",
    "failed_outbox": "id",
    "{deadline}": "id",
    "parked_message": "id",
    "saga_tombstone": "saga_type, saga_id",
    "consumer_offset": "group_id, topic, partition",
    "dead_letter": "id",
}
REFERENCE = (
    "schema_version",
    "partition_count",
    "partition_growth",
    "operator_audit",
    "citus_node",
    LAYOUT_TABLE,
)
# Kept on the coordinator alone, as a plain table outside Citus's metadata: the deadline poller's
# lease is renewed every few seconds, and a reference table's write needs every worker, so one
# stopped worker would stop the deadlines of every bucket. The coordinator, which every statement
# goes through anyway, is all it needs; the claims' lease check reads it as a subplan. (A Citus
# local table would do as well, but two schemas holding one deadlocked when dropped at once.)
ON_COORDINATOR = ("{deadline_lock}",)
# Unique indexes that are not primary keys, re-made with the bucket first.
_UNIQUE = (
    "CREATE UNIQUE INDEX saga_history_applied_idx ON {t} (bucket, saga_type, saga_id, message_id)"
    " WHERE outcome = 'applied'",
)
_DEADLINE_UNIQUE = "ALTER TABLE {t} ADD UNIQUE (bucket, saga_type, saga_id, name)"


class BucketLayoutMismatch(ConfigurationError):
    """The settings name another partitioner than the one the tables were distributed under."""


def _names(schema: str, deadline: str, deadline_lock: str, name: str) -> sql.Composed:
    table = name.replace("{deadline}", deadline).replace("{deadline_lock}", deadline_lock)
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))


def read_layout(conn: psycopg.Connection[Any], schema: str) -> Buckets | None:
    """The schema's recorded layout; None when its tables are not distributed by bucket."""
    table = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(LAYOUT_TABLE))
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table.as_string(conn),)).fetchone()
    if not exists or not exists[0]:
        return None
    row = conn.execute(
        sql.SQL("SELECT buckets, partitioner, keys FROM {}").format(table)
    ).fetchone()
    if row is None:
        return None
    return Buckets(int(row[0]), normalise(str(row[1])), tuple(int(k) for k in row[2]))


def checked_layout(
    conn: psycopg.Connection[Any], schema: str, partitioner: Partitioner, keyed: str
) -> Buckets | None:
    """The schema's recorded layout (None: not by bucket), refused under another partitioner.

    Args:
        conn: A connection to the coordinator.
        schema: The schema whose tables are laid out.
        partitioner: ``SAGA_CONSUMER__PARTITIONER``.
        keyed: What the buckets follow, for the refusal (``partitions``, ``the commands' keys``).

    Raises:
        BucketLayoutMismatch: The tables were distributed under another partitioner.
    """
    found = read_layout(conn, schema)
    if found is not None and found.partitioner != partitioner:
        raise BucketLayoutMismatch(
            [
                f"schema {schema} is distributed by buckets of the {found.partitioner} "
                f"partitioner, and SAGA_CONSUMER__PARTITIONER is {partitioner}: buckets would no "
                f"longer match {keyed}; set it back"
            ]
        )
    return found


def layout_mark(schema: str) -> Callable[[psycopg.Connection[Any]], object]:
    """What a store's statements depend on in ``schema``'s layout, read by a connection.

    Whether the tables are distributed by bucket, and which table is the saga table (a move
    from a distributed schema makes every table anew). A store's connection reads it when it
    opens and after a failure (:class:`processor._postgres.held.HeldConnection`): when it
    changed, an operator moved the tables while the store ran, and its statements, made for the
    old layout, are made again on a new connection.
    """
    names = (
        sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(LAYOUT_TABLE)),
        sql.SQL("{}.saga_instance").format(sql.Identifier(schema)),
    )

    def read(conn: psycopg.Connection[Any]) -> object:
        row = conn.execute(
            "SELECT to_regclass(%s)::oid, to_regclass(%s)::oid",
            tuple(n.as_string(conn) for n in names),
        ).fetchone()
        return tuple(row) if row is not None else None

    return read


def bucketize(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    buckets: int,
    partitioner: Partitioner,
    deadline: str = "saga_deadline",
    deadline_lock: str = "saga_deadline_lock",
) -> Buckets:
    """Distributes the migrated plain tables of ``schema`` by bucket, in the caller's transaction.

    Existing rows get their saga's bucket (or their partition's), computed here with the
    partitioner, so a processor moving from one PostgreSQL keeps every row.

    Returns:
        The layout recorded.
    """

    def q(name: str) -> sql.Composed:
        return _names(schema, deadline, deadline_lock, name)

    def after_columns(layout_of: Buckets) -> None:
        _backfill(conn, q, layout_of)

    def unique() -> None:
        conn.execute(sql.SQL(_UNIQUE[0]).format(t=q("saga_history")))
        conn.execute(sql.SQL(_DEADLINE_UNIQUE).format(t=q("{deadline}")))

    # ON_COORDINATOR's tables stay plain tables of the coordinator (see there).
    return distribute_by_bucket(
        conn,
        q,
        by_bucket=BY_BUCKET,
        reference=REFERENCE,
        buckets=buckets,
        partitioner=partitioner,
        after_columns=after_columns,
        unique=unique,
    )


def distribute_by_bucket(
    conn: psycopg.Connection[Any],
    q: Callable[[str], sql.Composed],
    *,
    by_bucket: Mapping[str, str],
    reference: Sequence[str],
    buckets: int,
    partitioner: Partitioner,
    after_columns: Callable[[Buckets], object] | None = None,
    unique: Callable[[], object] | None = None,
) -> Buckets:
    """Records the layout, re-keys ``by_bucket``'s tables by bucket and distributes them.

    The first of ``by_bucket`` anchors a co-location group of its own, one shard a bucket; the
    others join it. ``after_columns`` fills the new ``bucket`` columns of rows already there,
    ``unique`` re-makes unique indexes with the bucket first; ``reference``'s tables become
    reference tables.
    """
    layout = q(LAYOUT_TABLE)
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (one boolean PRIMARY KEY DEFAULT true CHECK (one),"
            " buckets int NOT NULL, partitioner text NOT NULL, keys int[] NOT NULL,"
            " made_at timestamptz NOT NULL DEFAULT now())"
        ).format(layout)
    )
    layout_of = Buckets(buckets, partitioner, _bucket_keys(conn, buckets))
    for name in by_bucket:
        conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN bucket int").format(q(name)))
    if after_columns is not None:
        after_columns(layout_of)
    for name, key in by_bucket.items():
        table = q(name)
        conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN bucket SET NOT NULL").format(table))
        _drop_unique(conn, table)
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (bucket, {})").format(table, sql.SQL(key))
        )
    if unique is not None:
        unique()
    anchor, *others = by_bucket
    first = q(anchor).as_string(conn)
    # A co-location group of its own: by default Citus would join the group of any other table
    # with as many shards (another processor's), whose shards then move with these.
    conn.execute(
        "SELECT create_distributed_table(%s, 'bucket', shard_count => %s, colocate_with => 'none')",
        (first, buckets),
    )
    for name in others:
        conn.execute(
            "SELECT create_distributed_table(%s, 'bucket', colocate_with => %s)",
            (q(name).as_string(conn), first),
        )
    _check_keys(conn, first, layout_of.keys)
    conn.execute(
        sql.SQL("INSERT INTO {} (buckets, partitioner, keys) VALUES (%s, %s, %s)").format(layout),
        (buckets, partitioner, list(layout_of.keys)),
    )
    for name in reference:
        conn.execute("SELECT create_reference_table(%s)", (q(name).as_string(conn),))
    return layout_of


def _backfill(conn: psycopg.Connection[Any], q: Any, plain: Buckets) -> None:
    """Each existing row's bucket key: its saga's, else its partition's."""
    ids: set[str] = set()
    for name in BY_BUCKET:
        if name in ("consumer_offset", "dead_letter"):
            continue
        rows = conn.execute(
            sql.SQL("SELECT DISTINCT saga_id FROM {} WHERE saga_id IS NOT NULL").format(q(name))
        ).fetchall()
        ids.update(str(r[0]) for r in rows)
    if ids:
        conn.execute(
            "CREATE TEMP TABLE saga_bucket (saga_id text PRIMARY KEY, b int) ON COMMIT DROP"
        )
        with conn.cursor().copy("COPY saga_bucket (saga_id, b) FROM STDIN") as copy:
            for saga_id in ids:
                copy.write_row((saga_id, plain.of(saga_id)))
        for name in BY_BUCKET:
            if name in ("consumer_offset", "dead_letter"):
                continue
            conn.execute(
                sql.SQL(
                    "UPDATE {} AS x SET bucket = m.b FROM saga_bucket AS m"
                    " WHERE x.saga_id = m.saga_id"
                ).format(q(name))
            )
    for name, column in (
        ("outbox", "coalesce(source_partition, partition, 0)"),
        ("failed_outbox", "coalesce(source_partition, partition, 0)"),
        ("consumer_offset", "partition"),
        ("dead_letter", "partition"),
    ):
        conn.execute(
            sql.SQL("UPDATE {} SET bucket = (%s::int[])[{} %% %s + 1] WHERE bucket IS NULL").format(
                q(name), sql.SQL(column)
            ),
            (list(plain.keys), plain.count),
        )


def _bucket_keys(conn: psycopg.Connection[Any], buckets: int) -> tuple[int, ...]:
    """For each of ``buckets`` hash-distributed shards, in hash order, the least int in it.

    Citus splits the 32-bit hash space into equal ranges, one per shard (the last one takes the
    remainder); :func:`_check_keys` confirms it on the tables made.
    """
    rows = conn.execute(
        """
        WITH s AS (
            SELECT i, -2147483648::bigint + i * (4294967296 / %(n)s) AS lo,
                   CASE WHEN i = %(n)s - 1 THEN 2147483647
                        ELSE -2147483648::bigint + (i + 1) * (4294967296 / %(n)s) - 1 END AS hi
              FROM generate_series(0, %(n)s - 1) AS i)
        SELECT DISTINCT ON (i) i, v FROM s, generate_series(0, 200000) AS v
         WHERE worker_hash(v) BETWEEN s.lo AND s.hi
         ORDER BY i, v
        """,
        {"n": buckets},
    ).fetchall()
    keys = tuple(int(v) for _, v in rows)
    if len(keys) != buckets:
        raise RuntimeError(f"found bucket keys for {len(keys)} of {buckets} shards")
    return keys


def _check_keys(conn: psycopg.Connection[Any], table: str, keys: tuple[int, ...]) -> None:
    """Each bucket's key is in its own shard, in order (else Citus's ranges moved on us)."""
    rows = conn.execute(
        """
        SELECT k, (SELECT s.shardminvalue::int FROM pg_dist_shard AS s
                    WHERE s.logicalrelid = %s::regclass
                      AND worker_hash(k) BETWEEN s.shardminvalue::int AND s.shardmaxvalue::int)
          FROM unnest(%s::int[]) WITH ORDINALITY AS u(k, n) ORDER BY n
        """,
        (table, list(keys)),
    ).fetchall()
    shards = [r[1] for r in rows]
    if None in shards or shards != sorted(set(shards)):
        raise RuntimeError(f"bucket keys {keys} do not map one to one onto {table}'s shards")


def _drop_unique(conn: psycopg.Connection[Any], table: sql.Composed) -> None:
    """Drops the table's primary key, unique constraints and unique indexes."""
    name = table.as_string(conn)
    for (constraint,) in conn.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype IN ('p', 'u')",
        (name,),
    ).fetchall():
        conn.execute(
            sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(table, sql.Identifier(constraint))
        )
    for (index,) in conn.execute(
        "SELECT i.indexrelid::regclass::text FROM pg_index AS i"
        " WHERE i.indrelid = %s::regclass AND i.indisunique",
        (name,),
    ).fetchall():
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.SQL(index)))
