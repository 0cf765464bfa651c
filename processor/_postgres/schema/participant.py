"""Tables of a participant service (inbox, outbox, failed outbox, positions), in its own schema.

A participant's tables never share the processor's migration list: a service may run without
any saga in its database. The outbox and failed outbox have the processor's shapes, so that the
processor's relay and its PostgreSQL store publish them unchanged (:class:`Tables` renders the
same ``{outbox}`` and ``{failed_outbox}`` names inside the participant's schema) and their DDL
is the processor's own (:func:`processor._postgres.schema.tables.outbox_ddl`). Both lists are
applied by the one runner of :mod:`processor._postgres.schema.runner`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from processor._engine.partitioner import Partitioner
from processor._errors import ConfigurationError
from processor._postgres.schema.buckets import (
    checked_layout,
    distribute_by_bucket,
    read_layout,
)
from processor._postgres.schema.citus import Distributed, distributed
from processor._postgres.schema.runner import apply_migrations, migrate_schema
from processor._postgres.schema.tables import (
    Tables,
    citus_node_ddl,
    failed_outbox_ddl,
    outbox_ddl,
    outbox_source_ddl,
)

log = logging.getLogger(__name__)

__all__ = [
    "PARTICIPANT_BY_BUCKET",
    "PARTICIPANT_MIGRATIONS",
    "bucket_participant",
    "distribute_service_tables",
    "migrate_participant",
    "migrate_service",
]

# Each entry is one migration; never edit a released one, append a new one.
PARTICIPANT_MIGRATIONS: tuple[str, ...] = (
    """
    -- One row per command message id, written in the transaction that ran its handler: the
    -- primary key, not a lookup, decides whether a delivery is new. The replies are kept so a
    -- redelivery sends them again, under the same message ids.
    CREATE TABLE {schema_q}.inbox (
        message_id   text        PRIMARY KEY,
        message_type text        NOT NULL,
        outcome      text        NOT NULL,
        replies      jsonb       NOT NULL DEFAULT '[]',
        topic        text        NOT NULL,
        partition    int         NOT NULL,
        "offset"     bigint      NOT NULL,
        at           timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX ON {schema_q}.inbox (at);

    """
    + outbox_ddl(retries=True)
    + failed_outbox_ddl()
    + """
    -- Where each partition's next command is; advanced in each command's transaction.
    CREATE TABLE {offsets} (
        group_id    text   NOT NULL,
        topic       text   NOT NULL,
        partition   int    NOT NULL,
        next_offset bigint,
        owner_epoch bigint NOT NULL DEFAULT 0,
        owner       text,
        updated_at  timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (group_id, topic, partition)
    );
    """,
    # 2 (relay12): the processor's outbox shape gained the source partition columns (always
    # NULL here: a participant's relay publishes every row on the one-at-a-time path).
    outbox_source_ddl(partitioned=False),
    # 3: on Citus, the one node the service's processes connect through, as the processor's
    # (processor/_postgres/schema/citus.py: pin_node).
    citus_node_ddl(),
)


# On tables distributed by bucket: the kit's tables, each with its key after the bucket (the inbox
# anchors the co-location group); the tables written rarely are reference tables.
PARTICIPANT_BY_BUCKET: dict[str, str] = {
    "inbox": "message_id",
    "outbox": "id",
    "failed_outbox": "id",
    "consumer_offset": "group_id, topic, partition",
}
PARTICIPANT_REFERENCE = ("participant_schema_version", "citus_node")


def migrate_participant(
    conn: psycopg.Connection[object],
    tables: Tables,
    distributed: Distributed = "auto",
    *,
    buckets: int | None = None,
    partitioner: Partitioner = "crc32",
) -> int:
    """Creates the participant's schema and applies pending migrations; returns the version.

    On Citus the schema is distributed as the processor's is
    (:func:`processor._postgres.schema.tables.migrate`): a distributed schema, whose inbox,
    outbox, positions and the service's own tables, made in the schema later, share one worker,
    so a command's transaction runs there alone; or, with ``buckets``, tables distributed by
    the bucket of each command's key, co-located, over every worker (:func:`bucket_participant`).

    Args:
        conn: The connection (not in a transaction).
        tables: Where the participant's tables live.
        distributed: Whether and how the tables are distributed over Citus (see
            :data:`processor._postgres.schema.citus.Distributed`).
        buckets: With ``distributed="buckets"``, the bucket count of a new schema (the command
            topics' partition count, ``SAGA_PARTICIPANT__BUCKETS``).
        partitioner: The producers' partitioner, that buckets are computed with.

    Raises:
        CitusUnavailable: Citus was asked for and the database does not have it.
        ConfigurationError: Buckets were asked for and cannot be made (see
            :func:`bucket_participant`).
    """
    schema_q = f'"{tables.schema}"'
    return migrate_schema(
        conn,
        [tables.render(ddl.replace("{schema_q}", schema_q)) for ddl in PARTICIPANT_MIGRATIONS],
        schema=tables.schema,
        lock=f"participant-migrate:{tables.schema}",
        version_table=f"{schema_q}.participant_schema_version",
        distributed=distributed,
        bucketed=lambda c: bucket_participant(c, tables, buckets, partitioner),
    )


def bucket_participant(
    conn: psycopg.Connection[Any], tables: Tables, buckets: int | None, partitioner: Partitioner
) -> None:
    """Distributes a new participant schema's tables by bucket, unless they are already.

    A schema made a distributed schema before (one worker) stays one, said in a warning: the
    service's own rows carry no bucket the kit could give them, so a schema holding rows is not
    moved either (refused); a new schema, under a new name, is the way to buckets.
    """
    if checked_layout(conn, tables.schema, partitioner, "the commands' keys") is not None:
        return
    if distributed(conn, tables.schema):
        log.warning(
            "participant schema %s is a Citus distributed schema (one worker) and stays one: "
            "its service's rows have no bucket to move them by; a new schema (another "
            "SAGA_PARTICIPANT__SCHEMA_NAME) is made by bucket",
            tables.schema,
        )
        return
    used = conn.execute(
        tables.render(
            'SELECT EXISTS (SELECT 1 FROM "{schema}".inbox) OR EXISTS (SELECT 1 FROM {offsets})'
        )
    ).fetchone()
    if used and used[0]:
        raise ConfigurationError(
            [
                f"participant schema {tables.schema} holds rows and is not distributed by "
                "bucket: the service's own rows carry no bucket the kit could give them; keep "
                "SAGA_DATABASE__DISTRIBUTED as it was, or start a new schema (another "
                "SAGA_PARTICIPANT__SCHEMA_NAME) by bucket"
            ]
        )
    if buckets is None:
        raise ConfigurationError(
            [
                "SAGA_DATABASE__DISTRIBUTED is 'buckets' and the participant schema is new: set "
                "SAGA_PARTICIPANT__BUCKETS (or SAGA_DATABASE__BUCKETS, which it defaults to) "
                "to the command topics' partition count"
            ]
        )

    def q(name: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(tables.schema), sql.Identifier(name))

    distribute_by_bucket(
        conn,
        q,
        by_bucket=PARTICIPANT_BY_BUCKET,
        reference=PARTICIPANT_REFERENCE,
        buckets=buckets,
        partitioner=partitioner,
    )


def migrate_service(
    conn: psycopg.Connection[object], tables: Tables, migrations: Sequence[str]
) -> int:
    """Applies a service's own pending migrations in its schema; returns how many it applied.

    Each entry of ``migrations`` is applied once, in order, with unqualified names landing in the
    participant's schema; never edit a released one, append a new one. Runs after
    :func:`migrate_participant`, which makes the schema. On tables distributed by bucket, the
    tables they make are distributed next (:func:`distribute_service_tables`).
    """
    with conn.transaction():
        # Citus passes DDL to the worker as the text sent: one statement at a time there.
        by_bucket = read_layout(conn, tables.schema) is not None
        split = by_bucket or distributed(conn, tables.schema)
    current = apply_migrations(
        conn,
        # As bytes: a service's own SQL goes to the server as written.
        [ddl.encode() for ddl in migrations],
        lock=f"service-migrate:{tables.schema}",
        version_table=f'"{tables.schema}".service_schema_version',
        search_path=tables.schema,
        split=split,
    )
    if by_bucket:
        with conn.transaction():
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"service-migrate:{tables.schema}",)
            )
            distribute_service_tables(conn, tables)
    return max(0, len(migrations) - current)


# The service's tables Citus does not know yet (made by its migrations since the last start).
_NEW_TABLES = """
SELECT c.oid::regclass::text,
       a.attname IS NOT NULL,
       a.atthasdef
  FROM pg_class AS c
  JOIN pg_namespace AS n ON n.oid = c.relnamespace
  LEFT JOIN pg_attribute AS a
         ON a.attrelid = c.oid AND a.attname = 'bucket' AND NOT a.attisdropped
 WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND NOT c.relispartition
   AND NOT EXISTS (SELECT 1 FROM pg_dist_partition AS d WHERE d.logicalrelid = c.oid)
 ORDER BY 1
"""


def distribute_service_tables(conn: psycopg.Connection[Any], tables: Tables) -> list[str]:
    """Distributes the service's new tables of a schema by bucket; returns what it did.

    A table with a ``bucket`` column is distributed by it, co-located with the inbox: a handler
    writes each row with its command's bucket (its ``Bucket`` parameter), so its rows sit on the
    worker of the command's inbox row, and a command's transaction runs there. A table without
    one is shared by every bucket's commands (an account debited by many sagas): it becomes a
    reference table, a copy on every worker, each write committed on all of them. In the
    caller's transaction.

    Raises:
        ConfigurationError: A table cannot be distributed: its ``bucket`` column has a default
            (a row written without the command's bucket would land away from it, unseen), or
            Citus refuses it (a primary key or unique index without ``bucket``; the reason
            quoted).
    """
    inbox = f'"{tables.schema}".inbox'
    done: list[str] = []
    problems: list[str] = []
    for name, by_bucket, has_default in conn.execute(_NEW_TABLES, (tables.schema,)).fetchall():
        if by_bucket and has_default:
            problems.append(
                f"service table {name}: its bucket column has a default; give it none, and "
                "write each row with its command's bucket (a handler's Bucket parameter)"
            )
            continue
        try:
            with conn.transaction():
                if by_bucket:
                    conn.execute(
                        "SELECT create_distributed_table(%s, 'bucket', colocate_with => %s)",
                        (name, inbox),
                    )
                else:
                    conn.execute("SELECT create_reference_table(%s)", (name,))
        except psycopg.Error as e:
            how = "by its bucket column" if by_bucket else "as a reference table"
            hint = (
                "; its primary key and unique indexes must include bucket (lead with it)"
                if by_bucket
                else ""
            )
            problems.append(
                f"service table {name} cannot be distributed {how}: "
                f"{e.diag.message_primary or type(e).__name__}{hint}"
            )
            continue
        done.append(f"{name} {'by bucket' if by_bucket else 'as a reference table'}")
    if problems:
        raise ConfigurationError(problems)
    for what in done:
        log.info("participant schema %s: service table %s", tables.schema, what)
    return done
