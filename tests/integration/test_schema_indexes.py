"""The schema's indexes against a real PostgreSQL: what migration 11 drops, and what still serves.

Every index on the saga tables costs each saga write an entry, so an index goes once another
serves its queries. These tests pin the names PostgreSQL gave the dropped indexes (an upgraded
schema ends up with the same indexes as a fresh one) and that each query the dropped indexes
served still finds its rows through an index: with sequential scans disabled, the plan must not
fall back to one, and the whole key must be the index condition, not a walk of the whole index.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from processor.postgres import schema as schema_module
from processor.postgres.connect import ensure_schema
from processor.postgres.inspect import InspectQueries
from processor.postgres.schema import MIGRATIONS, Tables
from processor.postgres.store import BatchStore, Conn

DROPPED = ("saga_instance_saga_id_idx",)
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


def test_migration_11_drops_the_indexes_of_an_existing_schema(
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

    assert ensure_schema(database_url, tables) == 11 == len(MIGRATIONS)
    with psycopg.connect(database_url, autocommit=True) as conn:
        after = _indexes(conn, pg_schema)
        fresh = _indexes(conn, fresh_schema)
    assert set(before) - set(after) == set(DROPPED)
    assert set(after) <= set(before)
    # Upgraded or fresh, the same indexes with the same definitions.
    assert after == fresh


def _plan(conn: Conn, query: str, params: tuple[object, ...]) -> str:
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
                BatchStore(conn, tables, "g")._load_sagas,
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
