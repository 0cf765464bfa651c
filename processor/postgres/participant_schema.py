"""Tables of a participant service (inbox, outbox, failed outbox, positions), in its own schema.

A participant's tables never share the processor's migration list: a service may run without
any saga in its database. The outbox and failed outbox have the processor's shapes, so that the
processor's relay and its PostgreSQL store publish them unchanged (:class:`Tables` renders the
same ``{outbox}`` and ``{failed_outbox}`` names inside the participant's schema).
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from processor.postgres.schema import Tables

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

    CREATE TABLE {outbox} (
        id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        saga_type  text,
        saga_id    text,
        topic      text        NOT NULL,
        partition  int,
        key        bytea,
        headers    jsonb       NOT NULL,
        value      bytea       NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        attempts   int         NOT NULL DEFAULT 0,
        last_error text
    ) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

    CREATE TABLE {failed_outbox} (
        id          bigint      PRIMARY KEY,
        saga_type   text,
        saga_id     text,
        topic       text        NOT NULL,
        partition   int,
        key         bytea,
        headers     jsonb       NOT NULL,
        value       bytea       NOT NULL,
        created_at  timestamptz NOT NULL,
        reason      text        NOT NULL,
        attempts    int         NOT NULL,
        held_behind bigint,
        failed_at   timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX ON {failed_outbox} (saga_type, saga_id, id);

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
    """
    ALTER TABLE {outbox} ADD COLUMN source_topic     text,
                         ADD COLUMN source_partition int;
    ALTER TABLE {failed_outbox} ADD COLUMN source_topic     text,
                                ADD COLUMN source_partition int;
    CREATE INDEX ON {outbox} (id) WHERE source_topic IS NULL;
    CREATE INDEX ON {outbox} (saga_type, saga_id, id) WHERE source_topic IS NULL;
    """,
)


def migrate_participant(conn: psycopg.Connection[object], tables: Tables) -> int:
    """Creates the participant's schema and applies pending migrations; returns the version."""
    with conn.transaction():
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"participant-migrate:{tables.schema}",)
        )
        exists = conn.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = %s", (tables.schema,)
        ).fetchone()
        if exists is None:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(tables.schema)))
        version_table = f'"{tables.schema}".participant_schema_version'
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {version_table} "
            "(version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        row = conn.execute(f"SELECT coalesce(max(version), 0) FROM {version_table}").fetchone()
        current = int(row[0]) if row else 0  # type: ignore[index]
        for number, ddl in enumerate(PARTICIPANT_MIGRATIONS[current:], start=current + 1):
            conn.execute(tables.render(ddl.replace("{schema_q}", f'"{tables.schema}"')))
            conn.execute(f"INSERT INTO {version_table} (version) VALUES (%s)", (number,))
        return len(PARTICIPANT_MIGRATIONS)


def migrate_service(
    conn: psycopg.Connection[object], tables: Tables, migrations: Sequence[str]
) -> int:
    """Applies a service's own pending migrations in its schema; returns how many it applied.

    Each entry of ``migrations`` is applied once, in order, with unqualified names landing in the
    participant's schema; never edit a released one, append a new one. Runs after
    :func:`migrate_participant`, which makes the schema.
    """
    with conn.transaction():
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"service-migrate:{tables.schema}",)
        )
        version_table = f'"{tables.schema}".service_schema_version'
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {version_table} "
            "(version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        row = conn.execute(f"SELECT coalesce(max(version), 0) FROM {version_table}").fetchone()
        current = int(row[0]) if row else 0  # type: ignore[index]
        conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(tables.schema)))
        for number, ddl in enumerate(migrations[current:], start=current + 1):
            conn.execute(ddl.encode())
            conn.execute(f"INSERT INTO {version_table} (version) VALUES (%s)", (number,))
        return max(0, len(migrations) - current)
