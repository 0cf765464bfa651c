"""A batch's statements against a real PostgreSQL whose statistics lag behind its tables.

A table filled faster than autovacuum analyzes it still looks small to the planner. Each of a
batch's lookups must stay an index probe per key even then: planned as a join, a lookup of a
batch's keys hashed a scan of the whole table (every applied history row, every saga), so each
batch cost the size of the table. Reads are written as one probe per key; the batch store's
connection is ``keyed`` for its updates and deletes.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from processor._postgres.batch.store import BatchSql
from processor._postgres.connect import connect, ensure_schema
from processor._postgres.schema.tables import Tables

ROWS = 20_000
KEYS = 200
# Statistics stay those of empty tables: no autovacuum, no ANALYZE.
STALE = ("instance", "history", "tombstone", "deadline")


@pytest.fixture
def filled(database_url: str, pg_schema: str) -> Tables:
    tables = Tables(pg_schema)
    ensure_schema(database_url, tables)
    with psycopg.connect(database_url, autocommit=True) as conn:
        for table in STALE:
            conn.execute(tables.render(f"ALTER TABLE {{{table}}} SET (autovacuum_enabled = false)"))
        fills = (
            """
            INSERT INTO {instance} (saga_type, saga_id, state, status, version)
            SELECT 'transfer', 's-' || g, '{{}}'::jsonb, 'active', 1
              FROM generate_series(1, %s) AS g
            """,
            """
            INSERT INTO {history} (saga_type, saga_id, message_id, message_type, kind, outcome,
                                   version, topic, partition, "offset")
            SELECT 'transfer', 's-' || g, 'm-' || g, 'T', 'event', 'applied', 1, 'in', 0, g
              FROM generate_series(1, %s) AS g
            """,
            """
            INSERT INTO {tombstone} (saga_type, saga_id, ended_at)
            SELECT 'transfer', 'gone-' || g, now() FROM generate_series(1, %s) AS g
            """,
            """
            INSERT INTO {deadline} (id, saga_type, saga_id, name, due_at, topic, partition)
            SELECT gen_random_uuid(), 'transfer', 's-' || g, 'timeout', now(), 'in', 0
              FROM generate_series(1, %s) AS g
            """,
        )
        for fill in fills:
            conn.execute(tables.render(fill), (ROWS,))
    return tables


def _picked() -> list[str]:
    """Half the keys exist, half are new sagas, as in a batch of mixed traffic."""
    existing = [f"s-{n}" for n in range(1, ROWS, ROWS // (KEYS // 2))]
    return existing + [f"new-{n}" for n in range(KEYS // 2)]


def _rows_read(plan: dict[str, Any], table: str) -> int:
    """Rows the plan's scans of ``table`` produced or filtered out, over all their loops."""
    total = 0
    if plan.get("Relation Name") == table:
        total += int(plan.get("Actual Rows", 0)) * int(plan.get("Actual Loops", 1))
        total += int(plan.get("Rows Removed by Filter", 0))
        total += int(plan.get("Rows Removed by Index Recheck", 0))
    for child in plan.get("Plans", []):
        total += _rows_read(child, table)
    return total


def _read(conn: psycopg.Connection[Any], query: str, param: str, table: str) -> int:
    with conn.transaction(force_rollback=True):
        row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, (param,)).fetchone()
    assert row is not None
    doc = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return _rows_read(doc[0]["Plan"], table)


def test_the_loads_reads_probe_each_key_on_any_connection(
    database_url: str, filled: Tables
) -> None:
    picked = _picked()
    saga_keys = json.dumps([["transfer", s] for s in picked])
    message_keys = json.dumps([["transfer", s, "m-" + s[2:]] for s in picked])
    with connect(database_url, autocommit=True) as conn:
        store = BatchSql(conn, filled, "g")
        lookups = {
            "saga_instance": (store._load_sagas, saga_keys),
            "saga_tombstone": (store._load_tombstones, saga_keys),
            "saga_history": (store._load_applied, message_keys),
        }
        for table, (query, param) in lookups.items():
            read = _read(conn, query, param, table)
            # One probe per key finds a row or none; a scan reads the whole table.
            assert read <= 2 * len(picked), (table, read)
        found = conn.execute(store._load_applied, (message_keys,)).fetchall()
        assert len(found) == KEYS // 2


def test_the_writes_updates_and_deletes_probe_each_key_on_a_keyed_connection(
    database_url: str, filled: Tables
) -> None:
    picked = _picked()
    updates = json.dumps([["transfer", s, {}, "active", 2, None, 1, None, 1] for s in picked])
    saga_keys = json.dumps([["transfer", s] for s in picked])
    deadline_keys = json.dumps([["transfer", s, "timeout"] for s in picked])
    with connect(database_url, autocommit=True, keyed=True) as conn:
        store = BatchSql(conn, filled, "g")
        writes = {
            "saga_instance": (store._update_sagas, updates),
            "saga_deadline": (store._clear_deadlines, saga_keys),
        }
        for table, (query, param) in writes.items():
            read = _read(conn, query, param, table)
            assert read <= 2 * len(picked), (table, read)
        assert _read(conn, store._delete_deadlines, deadline_keys, "saga_deadline") <= 2 * KEYS
        # The same statements do their work: half the keys exist.
        with conn.transaction(force_rollback=True):
            assert conn.execute(store._update_sagas, (updates,)).rowcount == KEYS // 2
            assert conn.execute(store._delete_deadlines, (deadline_keys,)).rowcount == KEYS // 2
