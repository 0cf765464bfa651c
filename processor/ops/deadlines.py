"""Operator views of the deadline table: one saga's pending deadlines, and overdue ones.

An overdue deadline is normal for a moment (the poller fires it on its next wake-up); one that
stays overdue points at a poller that is down, cannot get the lease, or cannot reach Kafka.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from processor.cli import command, ops_connection, saga_key_arguments, text_table
from processor.postgres.schema import Tables
from processor.postgres.store import Conn
from processor.settings import ProcessorSettings

__all__ = ["DeadlineRow", "overdue_deadlines", "pending_deadlines"]

_COLUMNS = """
    id::text, saga_type, saga_id, name, due_at, payload, topic, partition, dispatched_at,
    dispatch_token
"""


@dataclass(frozen=True, slots=True)
class DeadlineRow:
    """One stored deadline.

    Attributes:
        id: The deadline's id; a fired record names it.
        saga_type: Type of the saga that scheduled it.
        saga_id: Id of that saga instance.
        name: Deadline name, unique per saga instance.
        due_at: When it becomes due (database clock).
        payload: JSON form of the payload given at scheduling, or None.
        topic: Input topic its fired record is produced to.
        partition: Partition of that topic (the saga's own).
        dispatched_at: When a poller last produced its fired record, or None.
        dispatch_token: Lease token of that poller, or None.
    """

    id: str
    saga_type: str
    saga_id: str
    name: str
    due_at: datetime
    payload: Any
    topic: str
    partition: int
    dispatched_at: datetime | None
    dispatch_token: int | None


def pending_deadlines(
    conn: Conn, tables: Tables, saga_type: str, saga_id: str
) -> list[DeadlineRow]:
    """Deadlines still scheduled for one saga instance, soonest first.

    Args:
        conn: A connection to the processor's database.
        tables: The processor's table names.
        saga_type: Saga type, e.g. ``"transfer-saga"``.
        saga_id: Saga instance id (its association value).
    """
    sql = tables.render(
        f"SELECT {_COLUMNS} FROM {{deadline}} WHERE saga_type = %s AND saga_id = %s "
        "ORDER BY due_at, name"
    )
    return [DeadlineRow(*row) for row in conn.execute(sql, (saga_type, saga_id)).fetchall()]


def overdue_deadlines(
    conn: Conn, tables: Tables, now: datetime | None = None, limit: int = 100
) -> list[DeadlineRow]:
    """Deadlines due at or before ``now``, oldest due first.

    Args:
        conn: A connection to the processor's database.
        tables: The processor's table names.
        now: Reference instant; None uses the database clock, the one the poller uses.
        limit: Maximum number of rows returned.
    """
    sql = tables.render(
        f"SELECT {_COLUMNS} FROM {{deadline}} "
        "WHERE due_at <= coalesce(%s::timestamptz, now()) ORDER BY due_at, id LIMIT %s"
    )
    return [DeadlineRow(*row) for row in conn.execute(sql, (now, limit)).fetchall()]


# -- command line ------------------------------------------------------------------------------

_HEADER = ("ID", "SAGA TYPE", "SAGA ID", "NAME", "DUE AT", "DISPATCHED AT", "TOKEN", "PAYLOAD")


def format_table(rows: Sequence[DeadlineRow]) -> str:
    """Renders rows as a fixed-width text table, header first."""
    return text_table(
        _HEADER,
        (
            (
                r.id,
                r.saga_type,
                r.saga_id,
                r.name,
                r.due_at.isoformat(),
                r.dispatched_at.isoformat() if r.dispatched_at else "-",
                str(r.dispatch_token) if r.dispatch_token is not None else "-",
                json.dumps(r.payload, sort_keys=True) if r.payload is not None else "-",
            )
            for r in rows
        ),
    )


def _overdue_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=100, help="at most this many rows")


@command(
    "deadlines",
    "list the deadlines still scheduled for one saga instance",
    arguments=saga_key_arguments,
)
def deadlines_command(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Prints one saga's pending deadlines; exit code 0 even when there are none."""
    conn, tables = ops_connection(settings)
    with conn:
        rows = pending_deadlines(conn, tables, args.saga_type, args.saga_id)
    print(
        format_table(rows)
        if rows
        else f"no deadlines scheduled for {args.saga_type} {args.saga_id}"
    )
    return 0


@command(
    "overdue",
    "list deadlines that are due but have not fired yet",
    arguments=_overdue_arguments,
)
def overdue_command(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Prints overdue deadlines, oldest due first."""
    conn, tables = ops_connection(settings)
    with conn:
        rows = overdue_deadlines(conn, tables, limit=args.limit)
    print(format_table(rows) if rows else "no overdue deadlines")
    return 0
