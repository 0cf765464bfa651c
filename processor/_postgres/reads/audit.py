"""SQL behind the operators' audit trail (migration 13): entries written, and read back.

An entry is written in the transaction of the action it records: by the batch that decided an
operator record (`processor._postgres.batch.store.BatchSql`), and beside the rows a direct action
changes (`processor._postgres.reads.inspect`, `processor._postgres.failed_outbox`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Unpack

import psycopg
from psycopg.rows import TupleRow

from processor._authoring.choices import known_keywords
from processor._engine.rows import AuditEntry
from processor._ports.views import AUDIT_LIMIT, AuditFilters, AuditRow
from processor._postgres.batch.sql import INSERT_AUDIT
from processor._postgres.schema.tables import Tables

Conn = psycopg.Connection[TupleRow]

__all__ = ["AuditSql", "encode_entries"]

_COLUMNS = "id, at, actor, action, reason, saga_type, saga_id, target, outcome"
# Only the filters given are put in the statement: a catch-all `%s IS NULL OR ...` would keep
# the planner off the (saga_type, saga_id, at) index that serves one saga's entries.
_FILTERS = {
    "saga_type": "saga_type = %(saga_type)s",
    "saga_id": "saga_id = %(saga_id)s",
    "action": "action = %(action)s",
    "since": "at >= now() - %(since)s::interval",
    # No index: a batch's entries are found by their sagas (`batch_entries`); a listing by
    # batch alone reads the trail, which holds one row per action.
    "batch": "target->>'batch' = %(batch)s",
}
# A batch's entries among its sagas: one probe of the (saga_type, saga_id, at) index per saga.
_BATCH = f"""
    SELECT {_COLUMNS} FROM {{audit}} AS a
      JOIN unnest(%(types)s::text[], %(ids)s::text[]) AS k(saga_type, saga_id)
     USING (saga_type, saga_id)
     WHERE a.target->>'batch' = %(batch)s
"""


class AuditSql:
    """The audit statements over one connection the caller owns (and its transactions)."""

    def __init__(self, conn: Conn, tables: Tables) -> None:
        self.conn = conn
        self._render = tables.render
        self._insert = tables.render(INSERT_AUDIT)

    def insert(self, entries: Iterable[AuditEntry]) -> None:
        """Writes the entries, in order, in the connection's current transaction."""
        encoded = encode_entries(entries)
        if encoded != "[]":
            self.conn.execute(self._insert, (encoded,))

    def entries(self, **filters: Unpack[AuditFilters]) -> list[AuditRow]:
        """Entries newest first, narrowed by the filters given (``batch``: its target's)."""
        known_keywords(filters, AuditFilters)
        params: dict[str, Any] = {key: filters.get(key) for key in _FILTERS}
        params["limit"] = filters.get("limit", AUDIT_LIMIT)
        rows = self.conn.execute(self.statement(params), params).fetchall()
        return [AuditRow(*row) for row in rows]

    def batch_entries(self, batch: str, sagas: Sequence[tuple[str, str]]) -> list[AuditRow]:
        """The entries of ``batch`` recorded for any of ``sagas`` (type, id), in no order."""
        params = {
            "batch": batch,
            "types": [t for t, _ in sagas],
            "ids": [i for _, i in sagas],
        }
        rows = self.conn.execute(self._render(_BATCH), params).fetchall()
        return [AuditRow(*row) for row in rows]

    def statement(self, params: dict[str, Any]) -> str:
        """The listing's SQL with only the filters ``params`` gives (not None)."""
        where = [text for key, text in _FILTERS.items() if params.get(key) is not None]
        return self._render(
            f"SELECT {_COLUMNS} FROM {{audit}}"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY at DESC, id DESC LIMIT %(limit)s"
        )


def encode_entries(entries: Iterable[AuditEntry]) -> str:
    """The entries as the JSON array of arrays `INSERT_AUDIT` reads.

    PostgreSQL text holds no NUL character: one typed into a console form is replaced, so the
    action and its record are not refused over it.
    """
    return json.dumps(
        [
            [
                _text(e.actor),
                _text(e.action),
                _text(e.reason),
                _text(e.saga_type),
                _text(e.saga_id),
                e.target,
                _text(e.outcome),
            ]
            for e in entries
        ],
        default=str,
    )


def _text(value: str | None) -> str | None:
    return value.replace("\x00", "\ufffd") if value is not None else None
