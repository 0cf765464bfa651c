"""The console's saga filters and cluster page against a real PostgreSQL.

Three thousand sagas: by outcome, by the correlation id of the event that started them, and by a
value in their state, each filter paged by key to the end without a saga twice or missed, and
each served by its index (migration 14) even where the table is small enough for a scan to win.
The cluster page's data: owners, epochs and offsets of partitions, the relay's backlog per
partition, failed rows and the deadline lease.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from processor._ports.views import SagaSummary
from processor._postgres.connect import ensure_schema
from processor._postgres.reads.cluster import cluster_view
from processor._postgres.reads.inspect import InspectQueries, list_statement
from processor._postgres.schema.tables import Tables
from processor.ops._filters import state_documents

pytestmark = pytest.mark.integration

SAGAS = 3000
OUTCOMES = ("COMPLETED", "FAILED", "CANCELLED", "TERMINATED")
# Every saga g: type t-(g % 3), customer c-(g % 100), country by g % 3, amount kept as a string;
# every third ended, with OUTCOMES[g % 4]; conversation conv-(g % 500) on its first event.
_SEED = """
INSERT INTO {instance} (saga_type, saga_id, state, status, version, updated_at, machine_state)
SELECT 't-' || (g % 3), 's-' || g,
       jsonb_build_object(
           'customer_id', 'c-' || (g % 100), 'amount', (g % 7) || '.00',
           'address', jsonb_build_object('country', (ARRAY['DE', 'FR', 'NL'])[1 + g % 3])),
       CASE WHEN g % 3 = 0 THEN 'ended' ELSE 'active' END, 2,
       now() - (g % 600) * interval '1 minute',
       CASE WHEN g % 3 = 0 THEN (ARRAY['COMPLETED','FAILED','CANCELLED','TERMINATED'])[1 + g % 4]
            ELSE 'RUNNING' END
  FROM generate_series(1, {n}) AS g;
INSERT INTO {history} (saga_type, saga_id, message_id, message_type, kind, outcome, version,
                       topic, partition, "offset", headers)
SELECT 't-' || (g % 3), 's-' || g, 'm-' || g || '-' || k, 'E', 'event', 'applied', k, 'in', 0,
       g * 2 + k, jsonb_build_object('correlation-id', 'conv-' || (g % 500) || '-' || k)
  FROM generate_series(1, {n}) AS g, generate_series(1, 2) AS k;
ANALYZE {instance};
ANALYZE {history};
"""


@pytest.fixture
def queries(database_url: str, pg_schema: str) -> Iterator[InspectQueries]:
    tables = Tables(pg_schema)
    ensure_schema(database_url, tables)
    conn = psycopg.connect(database_url, autocommit=True)
    for statement in tables.render(_SEED.replace("{n}", str(SAGAS))).split(";\n"):
        if statement.strip():
            conn.execute(statement)
    with InspectQueries(conn, tables) as q:
        yield q


def _all_pages(q: InspectQueries, page: int = 50, **filters: object) -> list[SagaSummary]:
    """Every saga the filters keep, page by page as the console asks for them."""
    rows: list[SagaSummary] = []
    after = None
    while True:
        got = q.list_sagas(after=after, limit=page, **filters)  # type: ignore[arg-type]
        rows += got
        if len(got) < page:
            return rows
        after = (got[-1].updated_at, got[-1].saga_type, got[-1].saga_id)


def _ids(rows: list[SagaSummary]) -> set[int]:
    ids = [int(r.saga_id.removeprefix("s-")) for r in rows]
    assert len(ids) == len(set(ids)), "a saga on two pages"
    return set(ids)


def test_filters_page_by_key_to_the_end(queries: InspectQueries) -> None:
    q = queries
    every = range(1, SAGAS + 1)
    failed = _all_pages(q, outcome="FAILED")
    assert _ids(failed) == {g for g in every if g % 3 == 0 and g % 4 == 1}
    assert {(r.status, r.machine_state) for r in failed} == {("ended", "FAILED")}
    # Oldest first, as the unfiltered list.
    assert [r.updated_at for r in failed] == sorted(r.updated_at for r in failed)

    customer = _all_pages(q, state_contains=state_documents("customer_id=c-7"))
    assert _ids(customer) == {g for g in every if g % 100 == 7}
    # Amounts are kept as strings; `amount=3.00` finds them too.
    both = _all_pages(
        q,
        page=7,
        saga_type="t-1",
        status="active",
        state_contains=state_documents("amount=3.00"),
    )
    assert _ids(both) == {g for g in every if g % 3 == 1 and g % 7 == 3}
    nested = _all_pages(q, page=200, state_contains=state_documents("address.country=NL"))
    assert _ids(nested) == {g for g in every if g % 3 == 2}

    # The correlation id of the saga's first event only.
    conversation = _all_pages(q, page=2, correlation_id="conv-42-1")
    assert _ids(conversation) == {g for g in every if g % 500 == 42}
    assert q.list_sagas(correlation_id="conv-42-2") == []
    ended = _all_pages(q, page=2, correlation_id="conv-42-1", status="ended")
    assert _ids(ended) == {g for g in every if g % 500 == 42 and g % 3 == 0}
    assert q.list_sagas(correlation_id="conv-42-1", older_than=timedelta(days=1)) == []


def _plan(q: InspectQueries, **filters: object) -> str:
    params: dict[str, object] = {"limit": 50, "after_at": None, **filters}
    docs = params.pop("docs", ())
    text = q._render(list_statement(params, docs))  # type: ignore[arg-type]
    rows = q.conn.execute("EXPLAIN " + text, params).fetchall()
    return "\n".join(str(r[0]) for r in rows)


def test_the_searches_are_served_by_their_indexes(queries: InspectQueries) -> None:
    q = queries
    with q.conn.transaction(force_rollback=True):
        # Small enough for a sequential scan to win: ask whether the indexed path exists. (The
        # state search has none on purpose: see migration 14.)
        q.conn.execute("SET LOCAL enable_seqscan = off")
        plan = _plan(q, correlation="conv-42-1", status="ended")
        assert re.search(r"Index Scan (on|using) saga_history_correlation_idx", plan), plan
        assert "Index Scan using saga_instance_pkey" in plan, plan
        assert "Seq Scan" not in plan, plan


def test_the_cluster_page_reads_owners_lease_and_relay(database_url: str, pg_schema: str) -> None:
    tables = Tables(pg_schema)
    ensure_schema(database_url, tables)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            tables.render(
                """
                INSERT INTO {offsets} (group_id, topic, partition, next_offset, owner_epoch,
                                       owner)
                VALUES ('g', 'in', 0, 40, 3, 'replica-a'), ('g', 'in', 1, NULL, 1, 'replica-b'),
                       ('g', 'in', 2, 7, 2, 'replica-a'), ('other', 'in', 0, 1, 9, 'elsewhere');
                INSERT INTO {deadline_lock} (name, holder, token, expires_at)
                VALUES ('deadline-poller', 'replica-b', 12, now() + interval '10 seconds');
                INSERT INTO {outbox} (saga_type, saga_id, topic, headers, value, source_topic,
                                      source_partition, created_at)
                SELECT 't', 's-' || g, 'cmd', '{{}}', 'x', CASE WHEN g <= 5 THEN 'in' END,
                       CASE WHEN g <= 5 THEN 2 END, now() - (10 - g) * interval '1 minute'
                  FROM generate_series(1, 8) AS g;
                INSERT INTO {failed_outbox} (id, topic, headers, value, created_at, reason,
                                             attempts, source_topic, source_partition)
                VALUES (100, 'cmd', '{{}}', 'x', now(), 'too-large', 1, 'in', 0),
                       (101, 'cmd', '{{}}', 'x', now(), 'too-large', 1, NULL, NULL);
                """
            )
        )
        # A session named as a replica's, so that replica-b shows as connected.
        with psycopg.connect(database_url, application_name="saga:replica-b"):
            view = cluster_view(conn, tables, "g", cap=4)
    by_partition = {p.partition: p for p in view.partitions}
    assert [(p.partition, p.owner, p.epoch, p.stored) for p in view.partitions] == [
        (0, "replica-a", 3, 40),
        (1, "replica-b", 1, None),
        (2, "replica-a", 2, 7),
    ]
    # Five rows wait on partition 2, counted up to the cap; the first has waited nine minutes.
    assert by_partition[2].relay.pending == 4
    oldest = by_partition[2].relay.oldest
    assert oldest is not None
    assert timedelta(minutes=9) <= oldest < timedelta(minutes=10)
    assert (by_partition[0].relay.pending, by_partition[0].relay.failed) == (0, 1)
    assert (view.unpartitioned.pending, view.unpartitioned.failed) == (3, 1)
    assert view.lease is not None
    assert (view.lease.holder, view.lease.token, view.lease.held) == ("replica-b", 12, True)
    replicas = {r.instance_id: r for r in view.replicas}
    assert (replicas["replica-a"].partitions, replicas["replica-a"].connections) == (2, 0)
    assert replicas["replica-b"].connections >= 1
    assert replicas["replica-b"].holds_lease
    assert "elsewhere" not in replicas
