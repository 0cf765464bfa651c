"""The schema's indexes against a real PostgreSQL: what migrations 11 to 17 change, what serves.

Every index on the saga tables costs each saga write an entry, so an index goes once another
serves its queries. These tests pin the names PostgreSQL gave the indexes the migrations drop (an
upgraded schema ends up with the same indexes as a fresh one) and that each query they served
still finds its rows through an index: with sequential scans disabled, the plan must not fall back
to one, and the whole key must be the index condition, not a walk of the whole index. The relay's
claim probes the outbox's saga index once per row it considers, however large the outbox.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg import sql

from processor._postgres.batch.store import BatchSql, Conn
from processor._postgres.connect import ensure_schema
from processor._postgres.deadlines import PostgresDeadlineStore
from processor._postgres.outbox import PostgresOutboxStore
from processor._postgres.reads.audit import AuditSql
from processor._postgres.reads.inspect import InspectQueries, list_statement
from processor._postgres.reads.operator import OperatorQueries
from processor._postgres.schema import tables as schema_module
from processor._postgres.schema.tables import MIGRATIONS, Tables

DROPPED = (
    "saga_instance_saga_id_idx",
    # Migration 15: the console's list reads the (saga_type, status, updated_at) index instead.
    "saga_instance_status_updated_at_idx",
    "saga_instance_updated_at_saga_type_saga_id_idx",
    # Migration 17: the deadlines' partial (due_at) index serves the poller.
    "saga_deadline_due_at_idx",
)
ADDED = (
    # Added by migration 14 for the console's searches (see test_console_filters.py).
    "saga_history_correlation_idx",
    # Migration 15: parked sagas, which operators list and count, in age order.
    "saga_instance_parked_idx",
)
# Partial (rows of no source) before migration 12, every row after it, under the same name.
SAGA_ROWS = "outbox_saga_type_saga_id_id_idx"
TABLES = ("saga_instance", "saga_history", "saga_deadline", "outbox")


def _indexes(conn: Conn, schema: str) -> dict[str, str]:
    """Index name -> definition, with the schema's name taken out."""
    rows = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = ANY(%s)",
        (schema, list(TABLES)),
    ).fetchall()
    return {str(name): str(definition).replace(schema, "<schema>") for name, definition in rows}


@pytest.fixture
def fresh_schema(database_url: str) -> Iterator[str]:
    """A second schema, migrated from nothing, to compare an upgraded one with."""
    name = f"t_fresh_{uuid.uuid4().hex[:8]}"
    ensure_schema(database_url, Tables(name))
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def test_an_upgraded_schema_ends_with_the_indexes_of_a_fresh_one(
    database_url: str, pg_schema: str, fresh_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = Tables(pg_schema)
    # A schema as the release before migration 11 left it: the names are PostgreSQL's.
    with monkeypatch.context() as m:
        m.setattr(schema_module, "MIGRATIONS", MIGRATIONS[:10])
        assert ensure_schema(database_url, tables) == 10
    with psycopg.connect(database_url, autocommit=True) as conn:
        before = _indexes(conn, pg_schema)
    assert set(DROPPED) <= set(before)
    assert before[SAGA_ROWS].endswith(" WHERE (source_topic IS NULL)")

    assert ensure_schema(database_url, tables) == len(MIGRATIONS)
    with psycopg.connect(database_url, autocommit=True) as conn:
        after = _indexes(conn, pg_schema)
        fresh = _indexes(conn, fresh_schema)
    assert set(before) - set(after) == set(DROPPED)
    assert set(after) - set(before) == set(ADDED)
    assert after[SAGA_ROWS] == before[SAGA_ROWS].removesuffix(" WHERE (source_topic IS NULL)")
    # Upgraded or fresh, the same indexes with the same definitions.
    assert after == fresh


def _plan(conn: Conn, query: str, params: tuple[object, ...] | Mapping[str, object] | None) -> str:
    rows = conn.execute("EXPLAIN " + query, params).fetchall()
    return "\n".join(str(row[0]) for row in rows)


def test_lookups_by_saga_id_still_use_an_index(database_url: str, pg_schema: str) -> None:
    tables = Tables(pg_schema)
    ensure_schema(database_url, tables)
    with psycopg.connect(database_url, autocommit=True) as conn:
        # Three saga types; "shared-7" exists in two of them.
        conn.execute(
            tables.render(
                """
                INSERT INTO {instance} (saga_type, saga_id, state, status, version)
                SELECT t, 'shared-' || g, '{{}}'::jsonb, 'active', 1
                  FROM unnest(ARRAY['alpha', 'beta', 'gamma']) AS t,
                       generate_series(1, 2000) AS g
                 WHERE t <> 'beta' OR g % 2 = 0
                """
            )
        )
        conn.execute(tables.render("ANALYZE {instance}"))
        queries = InspectQueries(conn, tables)

        found = queries.find("shared-7")
        assert [(s.saga_type, s.saga_id) for s in found] == [
            ("alpha", "shared-7"),
            ("gamma", "shared-7"),
        ]
        assert [s.saga_type for s in queries.find("shared-8")] == ["alpha", "beta", "gamma"]
        assert [s.saga_type for s in queries.find("shared-8", limit=2)] == ["alpha", "beta"]
        assert queries.find("nobody") == []

        lookups = {
            # The console's and the CLI's search by id alone.
            "find": (queries._sql["find"], ("shared-7", 50)),
            # One saga, as `show` and an operator's retry read it; the batch store's load.
            "saga": (queries._sql["saga"], ("alpha", "shared-7")),
            "load": (
                BatchSql(conn, tables, "g")._load_sagas,
                ('[["alpha", "shared-7"], ["gamma", "shared-9"]]',),
            ),
        }
        with conn.transaction(force_rollback=True):
            # The table is small enough for a sequential scan (or a hash join over a whole
            # index) to win; ask whether a path that looks the keys up in an index exists.
            for setting in ("enable_seqscan", "enable_hashjoin", "enable_mergejoin"):
                conn.execute(f"SET LOCAL {setting} = off")
            for name, (query, params) in lookups.items():
                plan = _plan(conn, query, params)
                assert "Seq Scan on saga_instance" not in plan, (name, plan)
                # Both key columns: a condition on saga_id alone would walk the whole primary
                # key (an index condition on a column that is not its first).
                conds = [line for line in plan.splitlines() if "Index Cond" in line]
                assert any("saga_type =" in c and "saga_id =" in c for c in conds), (name, plan)
                assert "saga_instance_saga_id_idx" not in plan, (name, plan)


def test_the_relays_saga_guard_is_one_index_probe_per_row(
    database_url: str, pg_schema: str
) -> None:
    tables = Tables(pg_schema)
    ensure_schema(database_url, tables)
    partitions = [("in", p) for p in range(12)]
    with psycopg.connect(database_url, autocommit=True) as conn:
        # 50,000 rows, four per saga. Each saga's input partition is one of the first six; every
        # other saga moved to the partition six above it (its input topic grew) for half of its
        # rows, alternating, so those sagas' rows come from two partitions.
        conn.execute(
            tables.render(
                """
                INSERT INTO {outbox} (saga_type, saga_id, topic, headers, value, source_topic,
                                      source_partition)
                SELECT 'transfer', 's-' || g / 4, 'commands', '{{}}'::jsonb, '\\x00'::bytea, 'in',
                       (g / 4) % 6 + CASE WHEN (g / 4) % 2 = 0 AND g % 2 = 1 THEN 6 ELSE 0 END
                  FROM generate_series(0, 49999) AS g
                """
            )
        )
        conn.execute(tables.render("ANALYZE {outbox}"))
    with psycopg.connect(database_url) as conn:
        epochs = BatchSql(conn, tables, "g").claim(partitions, "me")
        conn.commit()
    owned = {tp: epoch for tp, (epoch, _) in epochs.items()}
    outbox = PostgresOutboxStore(lambda: psycopg.connect(database_url), tables, "g")
    params = outbox._owned_params(1000, owned, 16 * 1024 * 1024)
    with psycopg.connect(database_url) as conn, conn.transaction(force_rollback=True):
        plan = "\n".join(
            str(row[0])
            for row in conn.execute(
                "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + outbox._claim_owned, params
            )
        )
    assert "Seq Scan on outbox" not in plan, plan
    # One backward probe of the saga index per row of the window, for the row just before it.
    probe = (
        rf"Index Scan Backward using {SAGA_ROWS} on outbox n \(actual rows=\d+ loops=1000\)\n"
        r" *Index Cond: \(\(saga_type = (\w+)\.saga_type\) AND \(saga_id = \1\.saga_id\)"
        r" AND \(id < \1\.id\)\)"
    )
    assert re.search(probe, plan), plan
    # The window is the 250 oldest sagas; of the 125 moved ones only the first row goes, the
    # others each follow a row of the saga's other partition.
    claimed = re.match(r"Delete on outbox o \(actual rows=(\d+) ", plan)
    assert claimed is not None, plan
    assert int(claimed[1]) == 125 * 4 + 125, plan


def test_the_pollers_reads_go_through_the_partial_due_index(
    database_url: str, pg_schema: str
) -> None:
    # Migration 17 left one (due_at) index, of undispatched rows: the poller's sweep and its
    # next-due probe each read it, however many fired rows wait for their handlers.
    tables = Tables(pg_schema)
    ensure_schema(database_url, tables)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            tables.render(
                """
                INSERT INTO {deadline} (id, saga_type, saga_id, name, due_at, topic, partition,
                                        dispatched_at)
                SELECT gen_random_uuid(), 't', 's-' || g, 'timeout',
                       now() + (g - 2500) * interval '1 second', 'events', g % 6,
                       CASE WHEN g % 2 = 0 THEN now() END
                  FROM generate_series(1, 5000) AS g
                """
            )
        )
        conn.execute(tables.render("ANALYZE {deadline}"))
        store = PostgresDeadlineStore(lambda: psycopg.connect(database_url), tables)
        with conn.transaction(force_rollback=True):
            conn.execute("SET LOCAL enable_seqscan = off")
            claim = {"token": 1, "limit": 10, "name": "n", "holder": "h"}
            for statement, params in ((store._next_due, None), (store._claim_fresh, claim)):
                plan = _plan(conn, statement, params)
                assert "saga_deadline_due_at_idx1" in plan, plan
                assert "Seq Scan on saga_deadline" not in plan, plan
            due = conn.execute(store._next_due).fetchone()
        # The nearest undispatched future row: g = 2501 is odd, 1 s ahead.
        assert due is not None
        assert 0.0 < float(due[0]) <= 1.0


def test_the_audit_trail_is_read_through_its_indexes(database_url: str, pg_schema: str) -> None:
    tables = Tables(pg_schema)
    ensure_schema(database_url, tables)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            tables.render(
                """
                INSERT INTO {audit} (actor, action, reason, saga_type, saga_id, at, outcome)
                SELECT 'ana', 'terminate', 'r', 't', 's-' || g % 500,
                       now() - g * interval '1 minute', 'applied'
                  FROM generate_series(1, 5000) AS g
                """
            )
        )
        conn.execute(tables.render("ANALYZE {audit}"))
        audit = AuditSql(conn, tables)
        assert [a.saga_id for a in audit.entries(saga_type="t", saga_id="s-7", limit=3)] == [
            "s-7"
        ] * 3
        listings: dict[str, tuple[dict[str, object], str]] = {
            # `show`: one saga's entries.
            "saga": (
                {"saga_type": "t", "saga_id": "s-7", "limit": 1000},
                "operator_audit_saga_type_saga_id_at_idx",
            ),
            # `audit list`, newest first, and over the last hours.
            "newest": ({"limit": 100}, "operator_audit_at_idx"),
            "since": ({"since": "2 hours", "limit": 100}, "operator_audit_at_idx"),
        }
        with conn.transaction(force_rollback=True):
            conn.execute("SET LOCAL enable_seqscan = off")
            for name, (params, index) in listings.items():
                explained = conn.execute("EXPLAIN " + audit.statement(params), params)
                plan = "\n".join(str(row[0]) for row in explained.fetchall())
                assert f"Index Scan Backward using {index}" in plan, (name, plan)


def test_the_sagas_list_and_the_parked_sagas_are_read_through_an_index(
    database_url: str, pg_schema: str
) -> None:
    # Migration 15 left one index of the saga table in age order, (saga_type, status,
    # updated_at), and one of parked sagas: each list reads them, whichever filters it has.
    tables = Tables(pg_schema)
    ensure_schema(database_url, tables)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            tables.render(
                """
                INSERT INTO {instance} (saga_type, saga_id, state, status, version, updated_at)
                SELECT 'type-' || (g % 3), 's-' || g, '{{}}'::jsonb,
                       CASE WHEN g % 100 = 0 THEN 'parked' WHEN g % 2 = 0 THEN 'ended'
                            ELSE 'active' END, 1,
                       now() - g * interval '1 minute'
                  FROM generate_series(1, 3000) AS g
                """
            )
        )
        conn.execute(tables.render("ANALYZE {instance}"))
        queries = InspectQueries(conn, tables)
        after = (datetime.now(UTC) - timedelta(hours=5), "type-1", "s-300")
        lists: dict[str, dict[str, object]] = {
            "all": {},
            "status": {"status": "active"},
            "type": {"type": "type-1"},
            "older": {"older": timedelta(hours=2)},
            "next page": {"after_at": after[0], "after_type": after[1], "after_id": after[2]},
        }
        with conn.transaction(force_rollback=True):
            conn.execute("SET LOCAL enable_seqscan = off")
            for name, filters in lists.items():
                params: dict[str, object] = {"limit": 50, **filters}
                text = queries._render(list_statement(params))
                plan = "\n".join(
                    str(r[0]) for r in conn.execute("EXPLAIN " + text, params).fetchall()
                )
                assert "Seq Scan" not in plan, (name, plan)
                assert "saga_instance_saga_type_status_updated_at_idx" in plan, (name, plan)
                # Each pair's rows by both columns of the index, not a walk of the whole index.
                cond = r"Index Cond: \(\(saga_type = \S+\) AND \(status = "
                assert re.search(cond, plan), (name, plan)
            parked = OperatorQueries(conn, tables)._parked
            for query, params2 in (
                (parked, (50,)),
                (queries._sql["counts"], {"cap": 100}),
            ):
                plan = _plan(conn, query, params2)
                assert "Seq Scan on saga_instance" not in plan, plan
                assert "saga_instance_parked_idx" in plan, plan
        assert [s.status for s in queries.list_sagas(status="parked", limit=5)] == ["parked"] * 5
