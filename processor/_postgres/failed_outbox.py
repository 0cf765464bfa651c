"""SQL behind the failed-outbox operator commands: list, retry and discard set-aside rows.

Retry and discard take the relays' locks, waiting for every round in flight to end (the global
relay's and the partition relays'), so that a row never moves while a relay decides about its
saga. A retried row goes back into the outbox under its own id and with its source partition:
it is older than any row still there, so its partition's owner publishes it first, in order.
"""

from __future__ import annotations

from typing import Any, Unpack

from processor._authoring.choices import known_keywords
from processor._engine.records import OutboxRow
from processor._ports import FAILED_VALUE_PREVIEW, FailedOutboxRow, FailedSelection
from processor._postgres.held import Conn
from processor._postgres.outbox import partition_lock_key, relay_lock_key
from processor._postgres.reads.audit import AuditSql
from processor._postgres.schema.buckets import read_layout
from processor._postgres.schema.tables import Tables

__all__ = ["PostgresFailedOutbox"]

# The value only as far as an operator reads it, with its size: a retry copies it in the table.
_COLUMNS = f"""
    id, saga_type, saga_id, topic, partition, key, headers,
    substring(value FROM 1 FOR {FAILED_VALUE_PREVIEW}), octet_length(value), reason, attempts,
    held_behind, created_at, failed_at, source_topic, source_partition
"""
_LIST = f"""
    SELECT {_COLUMNS} FROM {{failed_outbox}}
     WHERE (%(saga_type)s::text IS NULL OR saga_type = %(saga_type)s::text)
       AND (%(saga_id)s::text IS NULL OR saga_id = %(saga_id)s::text)
     ORDER BY id LIMIT %(limit)s
"""
# A row of a saga selects its whole saga: its held rows must follow it back, in order.
_SELECT = f"""
    WITH picked AS (SELECT saga_type, saga_id FROM {{failed_outbox}} WHERE id = %(row_id)s)
    SELECT {_COLUMNS} FROM {{failed_outbox}} AS f
     WHERE (%(row_id)s::bigint IS NULL
            AND f.saga_type = %(saga_type)s::text AND f.saga_id = %(saga_id)s::text)
        OR (%(whole_saga)s AND EXISTS (
              SELECT 1 FROM picked AS p WHERE p.saga_id IS NOT NULL
                 AND f.saga_type = p.saga_type AND f.saga_id = p.saga_id))
        OR f.id = %(row_id)s::bigint
     ORDER BY id FOR UPDATE
"""
_DELETE = "DELETE FROM {failed_outbox} WHERE id = ANY(%s::bigint[])"
_REINSERT = """
    INSERT INTO {outbox} (id, saga_type, saga_id, topic, partition, key, headers, value,
                          created_at, source_topic, source_partition)
    OVERRIDING SYSTEM VALUE
    SELECT id, saga_type, saga_id, topic, partition, key, headers, value, created_at,
           source_topic, source_partition
      FROM {failed_outbox} WHERE id = ANY(%s::bigint[])
"""


class PostgresFailedOutbox:
    """:class:`processor._ports.FailedOutboxStore` on one connection the caller owns.

    The connection is expected in autocommit mode; each call is its own transaction.

    Args:
        conn: The connection.
        tables: Where the processor's tables live.
    """

    def __init__(self, conn: Conn, tables: Tables) -> None:
        self.conn = conn
        r = tables.render
        self._list = r(_LIST)
        self._select = r(_SELECT)
        self._delete = r(_DELETE)
        self._reinsert = r(_REINSERT)
        if read_layout(conn, tables.schema) is not None:
            # Distributed by bucket: the rows keep their bucket on the way back, and Citus
            # takes row locks only in a statement on one shard. The advisory locks below keep
            # every relay and operator away from these rows meanwhile, so none are needed.
            self._select = self._select.replace(" FOR UPDATE", "")
            self._reinsert = self._reinsert.replace(
                "source_partition)", "source_partition, bucket)"
            ).replace(
                "source_topic, source_partition\n", "source_topic, source_partition, bucket\n"
            )
        self._lock_keys = (relay_lock_key(tables), partition_lock_key(tables))
        self._audit = AuditSql(conn, tables)

    def list_failed(
        self, saga_type: str | None = None, saga_id: str | None = None, limit: int = 100
    ) -> list[FailedOutboxRow]:
        params = {"saga_type": saga_type, "saga_id": saga_id, "limit": limit}
        return [_row(r) for r in self.conn.execute(self._list, params).fetchall()]

    def retry_failed(self, **selection: Unpack[FailedSelection]) -> list[FailedOutboxRow]:
        return self._take(selection, retry=True)

    def discard_failed(self, **selection: Unpack[FailedSelection]) -> list[FailedOutboxRow]:
        return self._take(selection, retry=False)

    def _take(self, selection: FailedSelection, *, retry: bool) -> list[FailedOutboxRow]:
        known_keywords(selection, FailedSelection)
        params = {
            "saga_type": selection.get("saga_type"),
            "saga_id": selection.get("saga_id"),
            "row_id": selection.get("row_id"),
            "whole_saga": retry,
        }
        audit = selection.get("audit")
        with self.conn.transaction():
            # Waits for the relay rounds in flight: the saga's rows must not move under them.
            for key in self._lock_keys:
                self.conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))
            rows = [_row(r) for r in self.conn.execute(self._select, params).fetchall()]
            ids = [r.id for r in rows]
            if retry and ids:
                self.conn.execute(self._reinsert, (ids,))
            if ids:
                self.conn.execute(self._delete, (ids,))
                if audit is not None:
                    sagas = {(r.row.saga_type, r.row.saga_id) for r in rows}
                    self._audit.insert([audit.touching(ids, sagas)])
        return rows


def _row(r: tuple[Any, ...]) -> FailedOutboxRow:
    (id_, saga_type, saga_id, topic, partition, key, headers, value, size, reason, attempts) = r[
        :11
    ]
    return FailedOutboxRow(
        id=id_,
        row=OutboxRow(
            saga_type,
            saga_id,
            topic,
            key,
            headers,
            value,
            partition,
            source=(r[14], r[15]) if r[14] is not None and r[15] is not None else None,
        ),
        value_bytes=size,
        reason=reason,
        attempts=attempts,
        held_behind=r[11],
        created_at=r[12],
        failed_at=r[13],
    )
