"""Connections to the processor's database."""

from __future__ import annotations

import psycopg
from psycopg.rows import TupleRow

from processor.postgres.schema import Tables, migrate


def connect(
    url: str, *, application_name: str = "saga-processor", autocommit: bool = False
) -> psycopg.Connection[TupleRow]:
    """A connection with the processor's defaults (UTC session, bounded statement wait)."""
    return psycopg.connect(
        url,
        autocommit=autocommit,
        application_name=application_name,
        options="-c timezone=UTC -c lock_timeout=30s",
        connect_timeout=10,
    )


def ensure_schema(url: str, tables: Tables) -> int:
    """Creates or upgrades the schema; returns the schema version."""
    with connect(url, application_name="saga-processor-migrate") as conn:
        return migrate(conn, tables)
