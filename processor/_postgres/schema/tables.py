"""Versioned schema for every table the processor owns, created on startup when enabled.

All tables live in one schema (configurable); the deadline and lease tables have configurable
names too. Migrations are applied in order under an advisory lock by the one runner of
:mod:`processor._postgres.schema.runner`, so replicas starting together do not race each other. The
outbox tables' DDL is shared with a participant's schema, whose outbox has the same shape.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

import psycopg

from processor._engine.partitioner import Partitioner
from processor._errors import ConfigurationError
from processor._postgres.schema.buckets import bucketize, checked_layout
from processor._postgres.schema.citus import Distributed, distributed
from processor._postgres.schema.ddl import (
    MIGRATIONS,
    citus_node_ddl,
    failed_outbox_ddl,
    outbox_ddl,
    outbox_source_ddl,
)
from processor._postgres.schema.hold import hold_tables
from processor._postgres.schema.runner import VERSION_COLUMNS, migrate_schema
from processor._postgres.schema.undistribute import undistribute

# The DDL lives in processor._postgres.schema.ddl; offered here with the runner that applies it.
__all__ = [
    "MIGRATIONS",
    "Tables",
    "citus_node_ddl",
    "current_version",
    "failed_outbox_ddl",
    "migrate",
    "outbox_ddl",
    "outbox_source_ddl",
    "pending_sql",
    "sql_identifier",
]


@dataclass(frozen=True)
class Tables:
    """Qualified names of the processor's tables, fixed at startup."""

    schema: str
    deadline: str = "saga_deadline"
    deadline_lock: str = "saga_deadline_lock"

    def q(self, name: str) -> str:
        """Schema-qualified, quoted name; names are validated identifiers (see settings)."""
        return f'"{self.schema}"."{name}"'

    def render(self, template: str) -> str:
        """Fills `{instance}`-style placeholders in SQL with qualified table names."""
        return template.format(
            instance=self.q("saga_instance"),
            history=self.q("saga_history"),
            outbox=self.q("outbox"),
            failed_outbox=self.q("failed_outbox"),
            deadline=self.q(self.deadline),
            deadline_lock=self.q(self.deadline_lock),
            offsets=self.q("consumer_offset"),
            dead_letter=self.q("dead_letter"),
            parked=self.q("parked_message"),
            version=self.q("schema_version"),
            tombstone=self.q("saga_tombstone"),
            partition_count=self.q("partition_count"),
            partition_growth=self.q("partition_growth"),
            audit=self.q("operator_audit"),
            citus_node=self.q("citus_node"),
            schema=self.schema,
        )


def current_version(conn: psycopg.Connection[Any], tables: Tables) -> int:
    """The migration the schema is at; 0 when the schema or its version table is missing."""
    exists = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (tables.q("schema_version"),)
    ).fetchone()
    if not exists or not exists[0]:
        return 0
    row = conn.execute(tables.render("SELECT coalesce(max(version), 0) FROM {version}")).fetchone()
    return int(row[0]) if row else 0


def pending_sql(current: int, tables: Tables, *, distribute: bool = False) -> str:
    """The DDL `migrate` would run on a schema at migration ``current``, for review.

    The statements are those `migrate` runs, in order, each followed by the version row it
    records; `migrate` also takes an advisory lock and runs them in one transaction.

    Args:
        current: The migration the live schema is at (0: none).
        tables: Where the processor's tables live.
        distribute: `migrate` would make the schema a Citus distributed schema first
            (:func:`processor._postgres.schema.citus.will_distribute`).
    """
    parts: list[str] = []
    if current == 0:
        parts.append(f"CREATE SCHEMA IF NOT EXISTS {sql_identifier(tables.schema)};")
    if distribute:
        literal = "'" + sql_identifier(tables.schema).replace("'", "''") + "'"
        parts.append(
            "-- Citus: the schema's tables, these and those to come, in one shard group on a "
            f"worker\nSELECT citus_schema_distribute({literal}::regnamespace);"
        )
    if current == 0:
        parts.append(f"CREATE TABLE IF NOT EXISTS {tables.q('schema_version')} {VERSION_COLUMNS};")
    for number, ddl in enumerate(MIGRATIONS[current:], start=current + 1):
        parts.append(f"-- migration {number}\n" + textwrap.dedent(tables.render(ddl)).strip())
        parts.append(tables.render(f"INSERT INTO {{version}} (version) VALUES ({number});"))
    return "\n\n".join(parts) + ("\n" if parts else "")


def sql_identifier(name: str) -> str:
    """``name`` quoted as an SQL identifier (names are validated identifiers; see settings)."""
    return '"' + name.replace('"', '""') + '"'


def migrate(
    conn: psycopg.Connection[object],
    tables: Tables,
    distributed: Distributed = "auto",
    *,
    buckets: int | None = None,
    partitioner: Partitioner = "crc32",
    move: bool = False,
) -> int:
    """Creates the schema and applies pending migrations; returns the version reached.

    Args:
        conn: The connection (not in a transaction).
        tables: Where the processor's tables live.
        distributed: Whether the schema is made a Citus distributed schema (see
            :data:`processor._postgres.schema.citus.Distributed`).
        buckets: With ``distributed="buckets"``, the bucket count of a schema not distributed
            by bucket yet (``SAGA_DATABASE__BUCKETS``).
        partitioner: The producers' partitioner, that buckets are computed with.
        move: Tables that hold rows may be distributed by bucket (an operator's `migrate`,
            every replica stopped); a replica's start refuses to.

    Raises:
        CitusUnavailable: Citus was asked for and the database does not have it.
        ConfigurationError: Buckets were asked for and cannot be made (see
            :func:`bucket_tables`).
    """
    return migrate_schema(
        conn,
        [tables.render(ddl) for ddl in MIGRATIONS],
        schema=tables.schema,
        lock=f"saga-migrate:{tables.schema}",
        version_table=tables.q("schema_version"),
        distributed=distributed,
        bucketed=lambda c: bucket_tables(c, tables, buckets, partitioner, move=move),
    )


# A replica's start does not move rows: which of several starting replicas would, with what
# count, is the operator's choice. The replicas running meanwhile take the new layout up on
# their own (processor/_postgres/held.py).
_MOVE_BY_OPERATOR = (
    "schema {} {}: run `saga-processor migrate` with SAGA_DATABASE__DISTRIBUTED=buckets and "
    "SAGA_DATABASE__BUCKETS (it moves the rows, each to its saga's bucket; running replicas "
    "go on and take the new layout up), then start replicas with those settings"
)
_NO_COUNT = (
    "SAGA_DATABASE__DISTRIBUTED is 'buckets' and the schema is not distributed by bucket yet: "
    "set SAGA_DATABASE__BUCKETS to the input topics' partition count"
)


def bucket_tables(
    conn: psycopg.Connection[Any],
    tables: Tables,
    buckets: int | None,
    partitioner: Partitioner,
    *,
    move: bool = False,
) -> None:
    """Distributes the schema's tables by bucket, unless they are already.

    Plain tables that hold rows, and a Citus distributed schema, move only with ``move``, the
    operator's `migrate` (:func:`processor._postgres.schema.undistribute.undistribute` brings a
    distributed schema's back first), every table locked first (:func:`hold_tables`), while
    replicas may go on; no bucket count is refused.
    """
    if checked_layout(conn, tables.schema, partitioner, "partitions") is not None:
        return
    if distributed(conn, tables.schema):
        if not move:
            what = "is a Citus distributed schema"
            raise ConfigurationError([_MOVE_BY_OPERATOR.format(tables.schema, what)])
        if buckets is None:
            raise ConfigurationError([_NO_COUNT])
        hold_tables(conn, tables.schema)
        # Citus takes a distributed schema's tables back only without identity columns: they
        # are copied back by hand, ids kept, then distributed by bucket as plain tables are.
        undistribute(
            conn,
            tables.schema,
            [tables.render(ddl) for ddl in MIGRATIONS],
            tables.q("schema_version"),
        )
    else:
        used = conn.execute(
            tables.render(
                "SELECT EXISTS (SELECT 1 FROM {offsets}) OR EXISTS (SELECT 1 FROM {instance})"
            )
        ).fetchone()
        if used and used[0] and not move:
            what = "holds rows and is not distributed by bucket"
            raise ConfigurationError([_MOVE_BY_OPERATOR.format(tables.schema, what)])
        if buckets is None:
            raise ConfigurationError([_NO_COUNT])
        if used and used[0]:
            hold_tables(conn, tables.schema)
    bucketize(
        conn,
        tables.schema,
        buckets=buckets,
        partitioner=partitioner,
        deadline=tables.deadline,
        deadline_lock=tables.deadline_lock,
    )
