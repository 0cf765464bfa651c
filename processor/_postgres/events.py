"""A service's domain events, written to its outbox in the service's own transaction.

The rows are the participant kit's outbox rows (:mod:`processor._postgres.schema.participant`),
so the processor's relay publishes them once the transaction commits, and never when it rolls
back.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

import psycopg
from psycopg.pq import TransactionStatus

from processor._engine.buckets import Buckets
from processor._engine.records import OutboxRow
from processor._postgres.participant import PostgresParticipantTx
from processor._postgres.schema.buckets import read_layout
from processor._postgres.schema.tables import Tables
from processor._wire import outbox_channel

__all__ = ["AnyConnection", "insert_events"]

AnyConnection = psycopg.Connection[Any]
"""A caller's connection, whatever its row factory."""


# Each connection's read of each schema's layout: a participant schema's layout is made with the
# schema and never changes under rows (processor/_postgres/schema/participant.py).
_LAYOUTS: WeakKeyDictionary[AnyConnection, dict[str, Buckets | None]] = WeakKeyDictionary()


def _layout(conn: AnyConnection, schema: str) -> Buckets | None:
    known = _LAYOUTS.setdefault(conn, {})
    if schema not in known:
        known[schema] = read_layout(conn, schema)
    return known[schema]


def insert_events(conn: AnyConnection, tables: Tables, rows: list[OutboxRow]) -> None:
    """Inserts ``rows`` into the outbox of ``tables`` in ``conn``'s current transaction.

    The relays listening on the schema's outbox channel are woken when the transaction commits.

    Raises:
        ValueError: ``conn`` is in autocommit mode outside a transaction block, where each row
            would commit on its own, apart from the work it announces.
    """
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise ValueError(
            "the connection is in autocommit mode outside a transaction: publish inside "
            "`with conn.transaction():`, with the writes the events announce"
        )
    tx = PostgresParticipantTx(conn, tables, _layout(conn, tables.schema))
    tx.publish(rows)
    tx.flush()  # now, in the caller's transaction: nothing flushes it later
    # Delivered at commit, once per transaction however many events it published.
    conn.execute("SELECT pg_notify(%s, '')", (outbox_channel(tables.schema),))
