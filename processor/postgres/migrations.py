"""The one migration runner: a versioned list of steps, applied once each, under an advisory lock.

The processor's schema (:mod:`processor.postgres.schema`), a participant's tables and a
participant service's own migrations (:mod:`processor.postgres.participant_schema`) each keep
their steps and their version table; this module applies them the same way. Step N is recorded
as version N in the version table in the transaction that ran it, so a database migrated before
keeps its numbering, and replicas starting together take turns on the advisory lock: the later
ones find the work done.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

__all__ = ["VERSION_COLUMNS", "apply_migrations"]

VERSION_COLUMNS = "(version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
"""The columns of every version table."""


def apply_migrations(
    conn: psycopg.Connection[Any],
    steps: Sequence[str | bytes],
    *,
    lock: str,
    version_table: str,
    schema: str | None = None,
    search_path: str | None = None,
) -> int:
    """Applies the steps not yet recorded, in order, in one transaction.

    Args:
        conn: The connection (not in a transaction).
        steps: Every step ever released, rendered; step N is version N.
        lock: The advisory lock's key: one runner of these steps at a time.
        version_table: The qualified name of the table that records the versions applied.
        schema: Created first when missing.
        search_path: A schema that unqualified names in the steps land in.

    Returns:
        The version the schema was at before this call.
    """
    with conn.transaction():
        # One starter at a time; the others find the work done.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock,))
        if schema is not None:
            # Only when missing: CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege on the
            # database even when the schema exists, and an owner role given just its schema
            # (see deploy/sql/grants.sql) has none.
            exists = conn.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)
            ).fetchone()
            if exists is None:
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(f"CREATE TABLE IF NOT EXISTS {version_table} {VERSION_COLUMNS}")
        row = conn.execute(f"SELECT coalesce(max(version), 0) FROM {version_table}").fetchone()
        current = int(row[0]) if row else 0
        if search_path is not None:
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(search_path)))
        for number, step in enumerate(steps[current:], start=current + 1):
            conn.execute(step)
            conn.execute(f"INSERT INTO {version_table} (version) VALUES (%s)", (number,))
        return current
