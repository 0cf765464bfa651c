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

from processor._postgres.schema.citus import Distributed
from processor._postgres.schema.ddl import (
    MIGRATIONS,
    citus_node_ddl,
    failed_outbox_ddl,
    outbox_ddl,
    outbox_source_ddl,
)
from processor._postgres.schema.runner import VERSION_COLUMNS, migrate_schema

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
    conn: psycopg.Connection[object], tables: Tables, distributed: Distributed = "auto"
) -> int:
    """Creates the schema and applies pending migrations; returns the version reached.

    Args:
        conn: The connection (not in a transaction).
        tables: Where the processor's tables live.
        distributed: Whether the schema is made a Citus distributed schema (see
            :data:`processor._postgres.schema.citus.Distributed`).

    Raises:
        CitusUnavailable: Citus was asked for and the database does not have it.
    """
    return migrate_schema(
        conn,
        [tables.render(ddl) for ddl in MIGRATIONS],
        schema=tables.schema,
        lock=f"saga-migrate:{tables.schema}",
        version_table=tables.q("schema_version"),
        distributed=distributed,
    )
