"""How many statements a batch costs, against a real PostgreSQL.

The write is the stage a replica's other work waits for, and each statement is a round trip on
the database's clock: a batch of new sagas writes its saga, history, outbox and deadline rows and
sends its notifications in one statement after the offsets' compare-and-set, whatever its size.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from processor.engine.records import OffsetCommit, OutboxRow
from processor.engine.rows import ACTIVE, DeadlineInsert, HistoryRow, Outcome, SagaWrite, WriteSet
from processor.postgres.connect import ensure_schema
from processor.postgres.schema import Tables
from processor.postgres.store import BatchStore


class _Counting(psycopg.Connection[Any]):
    """A connection that records the text of each statement it executes."""

    statements: list[str]

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        self.statements.append(str(query))
        return super().execute(query, *args, **kwargs)


def _batch(n: int, stored: int) -> WriteSet:
    """``n`` sagas at version 2, the first ``stored`` of them updated from version 1."""
    due = datetime.now(UTC) + timedelta(seconds=1)
    ws = WriteSet()
    for i in range(n):
        sid, old = f"s{i}", i < stored
        version = 2 if old else 1
        ws.sagas.append(SagaWrite("t", sid, {"n": i}, ACTIVE, version, 1 if old else None, None))
        mid = f"m{version}-{i}"
        ws.history.append(
            HistoryRow("t", sid, mid, "E", "event", Outcome.APPLIED, version, "in", 0, i)
        )
        ws.outbox.append(OutboxRow("t", sid, "out", sid.encode(), {"message-id": mid}, b"{}"))
        ws.deadline_inserts.append(
            DeadlineInsert(
                f"0190{version:04x}{i:024x}", "t", sid, f"d{version}", due, None, "in", 0
            )
        )
    return ws


def test_a_batch_writes_every_tables_rows_in_one_statement_after_the_offsets(
    database_url: str, pg_schema: str
) -> None:
    tables = Tables(pg_schema)
    ensure_schema(database_url, tables)
    with _Counting.connect(database_url) as conn:
        conn.statements = []
        store = BatchStore(conn, tables, "g", wake_within=timedelta(seconds=30))
        with conn.transaction():
            store.claim([("in", 0)], "me")
        # Three new sagas; then those three updated beside 197 new ones.
        for size, stored, offsets in (
            (3, 0, [OffsetCommit("in", 0, 3, None, 1)]),
            (200, 3, [OffsetCommit("in", 0, 200, 3, 1)]),
        ):
            conn.statements.clear()
            with conn.transaction():
                store.write(_batch(size, stored), offsets)
            assert len(conn.statements) == 2, conn.statements
            combined = conn.statements[1]
            for table in ("saga_instance", "saga_history", "outbox", "saga_deadline"):
                assert f'"{pg_schema}"."{table}"' in combined
            assert combined.count("pg_notify") == 2
        counts = conn.execute(
            tables.render(
                "SELECT (SELECT count(*) FROM {instance}),"
                " (SELECT count(*) FROM {history}), (SELECT count(*) FROM {outbox}),"
                " (SELECT count(*) FROM {deadline})"
            )
        ).fetchone()
        conn.rollback()
    assert counts == (200, 203, 203, 203)
