"""The one migration runner: a versioned list of steps, applied once each, under an advisory lock.

The processor's schema (:mod:`processor._postgres.schema.tables`), a participant's tables and a
participant service's own migrations (:mod:`processor._postgres.schema.participant`) each keep
their steps and their version table; this module applies them the same way. Step N is recorded
as version N in the version table in the transaction that ran it, so a database migrated before
keeps its numbering, and replicas starting together take turns on the advisory lock: the later
ones find the work done.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql

from processor._postgres.schema.citus import (
    Distributed,
    distribute_schema,
    refuse_migrations_off_coordinator,
    use_citus,
)

__all__ = ["VERSION_COLUMNS", "apply_migrations", "migrate_schema", "split_statements"]

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
    prepare: Callable[[psycopg.Connection[Any]], object] | None = None,
    split: bool = False,
) -> int:
    """Applies the steps not yet recorded, in order, in one transaction.

    Args:
        conn: The connection (not in a transaction).
        steps: Every step ever released, rendered; step N is version N.
        lock: The advisory lock's key: one runner of these steps at a time.
        version_table: The qualified name of the table that records the versions applied.
        schema: Created first when missing.
        search_path: A schema that unqualified names in the steps land in.
        prepare: Called in the transaction once the schema exists, before any step (Citus
            distributes the schema there, so that the steps' tables are created in it).
        split: Send each statement of a step on its own (:func:`split_statements`), as Citus
            needs for the DDL it passes on to its workers.

    Returns:
        The version the schema was at before this call.

    Raises:
        MigrationsOffCoordinator: ``conn`` is to a Citus worker (DDL goes through the
            coordinator only) and steps are pending; a schema that is current passes.
    """
    if refuse_migrations_off_coordinator(conn, version_table, len(steps)):
        return len(steps)
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
        if prepare is not None:
            prepare(conn)
        conn.execute(f"CREATE TABLE IF NOT EXISTS {version_table} {VERSION_COLUMNS}")
        row = conn.execute(f"SELECT coalesce(max(version), 0) FROM {version_table}").fetchone()
        current = int(row[0]) if row else 0
        if search_path is not None:
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(search_path)))
        for number, step in enumerate(steps[current:], start=current + 1):
            for statement in split_statements(step) if split else [step]:
                conn.execute(statement)
            conn.execute(f"INSERT INTO {version_table} (version) VALUES (%s)", (number,))
        return current


def migrate_schema(
    conn: psycopg.Connection[Any],
    steps: Sequence[str],
    *,
    schema: str,
    lock: str,
    version_table: str,
    distributed: Distributed,
    bucketed: Callable[[psycopg.Connection[Any]], object] | None = None,
) -> int:
    """Creates ``schema`` and applies the pending steps in it; returns the version reached.

    The processor's schema and a participant's are made the same way: on Citus the schema is
    made a distributed schema before any step (so that their tables share one worker, see
    :mod:`processor._postgres.schema.citus`), and each statement of a step is sent on its own.

    Args:
        conn: The connection (not in a transaction).
        steps: Every step ever released, rendered; step N is version N.
        schema: The schema the steps' tables live in.
        lock: The advisory lock's key: one runner of these steps at a time.
        version_table: The qualified name of the table that records the versions applied.
        distributed: Whether the schema is made a Citus distributed schema.
        bucketed: With ``distributed="buckets"``, called after the steps under the same lock, in
            a transaction of its own, to distribute the tables by bucket (once; see
            :mod:`processor._postgres.schema.buckets`).

    Raises:
        CitusUnavailable: Citus was asked for and the database does not have it.
    """
    citus = use_citus(conn, distributed)
    if distributed == "buckets":
        apply_migrations(conn, steps, lock=lock, version_table=version_table, schema=schema,
                         split=True)  # fmt: skip
        if bucketed is not None:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock,))
                bucketed(conn)
        return len(steps)
    apply_migrations(
        conn,
        steps,
        lock=lock,
        version_table=version_table,
        schema=schema,
        prepare=(
            (lambda c: distribute_schema(c, schema, move=distributed == "citus")) if citus else None
        ),
        split=citus,
    )
    return len(steps)


def split_statements(step: str | bytes) -> list[str]:
    """The statements of one migration step, each sent on its own.

    Citus passes a DDL statement on to its workers as the text the client sent: a step sent
    whole would reach them as several commands in one, which they refuse. Semicolons inside
    quotes, dollar quotes and comments do not end a statement.
    """
    text = step.decode() if isinstance(step, bytes) else step
    out: list[str] = []
    start = i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c == "-" and text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
        elif c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif c in "'\"":
            end = text.find(c, i + 1)
            while end >= 0 and text.startswith(c * 2, end):
                end = text.find(c, end + 2)  # a doubled quote is one quote inside the string
            i = n if end < 0 else end + 1
        elif c == "$" and (tag := _dollar_tag(text, i)):
            end = text.find(tag, i + len(tag))
            i = n if end < 0 else end + len(tag)
        elif c == ";":
            out.append(text[start : i + 1])
            start = i = i + 1
        else:
            i += 1
    out.append(text[start:])
    return [s for s in out if _has_code(s)]


def _dollar_tag(text: str, i: int) -> str:
    # "$$" or "$name$" opens a dollar-quoted string; "$1" is a parameter, not a quote.
    end = text.find("$", i + 1)
    if end < 0:
        return ""
    tag = text[i : end + 1]
    return tag if tag[1:-1].replace("_", "a").isalnum() or tag == "$$" else ""


def _has_code(statement: str) -> bool:
    lines = (ln.split("--", 1)[0] for ln in statement.splitlines())
    return any(ln.strip(" \t;") for ln in lines)
