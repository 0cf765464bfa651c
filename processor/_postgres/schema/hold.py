"""Every table of a schema locked at once, before an operator's move rewrites them.

A move to tables by bucket alters, drops and distributes the tables one after another while the
replicas may go on writing them. Taken table by table, the move's locks and a batch's (the
offsets, then the sagas, the history, the outbox) could wait on each other in a cycle, and the
deadlock detector might end the move. So the move first takes every lock in one statement with a
short wait: when the batches in flight hold it past that wait, the attempt is undone (its locks
given back, so those batches commit) and taken again. Once it holds them, the batches wait for
the move's commit and then meet the new tables.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
from psycopg import errors, sql

__all__ = ["hold_tables"]

log = logging.getLogger(__name__)


def hold_tables(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    wait: float = 2.0,
    attempts: int = 30,
) -> None:
    """Locks every table of ``schema`` exclusively, in the caller's transaction.

    Args:
        conn: A connection in a transaction.
        schema: The schema whose tables the caller is about to rewrite.
        wait: How long one attempt waits for the locks, in seconds.
        attempts: How many attempts are made before giving up.

    Raises:
        RuntimeError: The locks were not granted in ``attempts`` attempts.
    """
    names = [
        sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(str(r[0])))
        for r in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = to_regnamespace(%s)"
            " AND relkind IN ('r', 'p') ORDER BY relname",
            (schema,),
        ).fetchall()
    ]
    if not names:
        return
    statement = sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.SQL(", ").join(names))
    row = conn.execute("SELECT current_setting('lock_timeout')").fetchone()
    before = str(row[0]) if row else "0"
    for attempt in range(1, attempts + 1):
        try:
            with conn.transaction():
                conn.execute(
                    sql.SQL("SET LOCAL lock_timeout = {}").format(
                        sql.Literal(f"{int(wait * 1000)}ms")
                    )
                )
                conn.execute(statement)
                # The rest of the move waits as the session would.
                conn.execute("SELECT set_config('lock_timeout', %s, true)", (before,))
            return
        except (errors.LockNotAvailable, errors.DeadlockDetected) as e:
            log.info(
                "schema %s: the move's locks were not granted (attempt %d of %d): %s",
                schema,
                attempt,
                attempts,
                e.diag.message_primary,
            )
            time.sleep(min(0.1 * attempt, 1.0))
    raise RuntimeError(
        f"schema {schema}: the move's locks were not granted in {attempts} attempts; "
        "run it again, or at a quieter hour"
    )
