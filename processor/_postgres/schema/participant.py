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

import psycopg

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

__all__ = ["PARTICIPANT_MIGRATIONS", "migrate_participant", "migrate_service"]

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


def migrate_participant(
    conn: psycopg.Connection[object], tables: Tables, distributed: Distributed = "auto"
) -> int:
    """Creates the participant's schema and applies pending migrations; returns the version.

    On Citus the schema is distributed as the processor's is
    (:func:`processor._postgres.schema.tables.migrate`): the inbox, the outbox, the positions and
    the service's own tables, made in the schema later, share one worker, so a command's
    transaction runs there alone.

    Raises:
        CitusUnavailable: Citus was asked for and the database does not have it.
    """
    if distributed == "buckets":
        # A participant's tables are not distributed by bucket (yet): a distributed schema, on
        # one worker, as with "citus". Said once, at each migration.
        log.warning(
            "participant schema %s: SAGA_DATABASE__DISTRIBUTED=buckets distributes a processor's "
            "tables; a participant's become a Citus distributed schema, as with 'citus'",
            tables.schema,
        )
        distributed = "citus"
    schema_q = f'"{tables.schema}"'
    return migrate_schema(
        conn,
        [tables.render(ddl.replace("{schema_q}", schema_q)) for ddl in PARTICIPANT_MIGRATIONS],
        schema=tables.schema,
        lock=f"participant-migrate:{tables.schema}",
        version_table=f"{schema_q}.participant_schema_version",
        distributed=distributed,
    )


def migrate_service(
    conn: psycopg.Connection[object], tables: Tables, migrations: Sequence[str]
) -> int:
    """Applies a service's own pending migrations in its schema; returns how many it applied.

    Each entry of ``migrations`` is applied once, in order, with unqualified names landing in the
    participant's schema; never edit a released one, append a new one. Runs after
    :func:`migrate_participant`, which makes the schema.
    """
    with conn.transaction():
        # Citus passes DDL to the worker as the text sent: one statement at a time there.
        split = distributed(conn, tables.schema)
    current = apply_migrations(
        conn,
        # As bytes: a service's own SQL goes to the server as written.
        [ddl.encode() for ddl in migrations],
        lock=f"service-migrate:{tables.schema}",
        version_table=f'"{tables.schema}".service_schema_version',
        search_path=tables.schema,
        split=split,
    )
    return max(0, len(migrations) - current)
