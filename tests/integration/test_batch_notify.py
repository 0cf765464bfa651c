"""Which batches notify the deadline poller's channel, against a real PostgreSQL.

A batch of far-off deadlines (the common payment timeout of half an hour) leaves the poller
asleep: its next planned look, at most one polling interval away, finds them in time. A batch
with a deadline due within that interval notifies every replica's poller, as before.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg

from processor.engine.rows import ACTIVE, DeadlineInsert, SagaWrite, WriteSet
from processor.postgres.connect import connect, ensure_schema
from processor.postgres.schema import Tables
from processor.postgres.store import BatchStore
from tests.support.harness import wait_until

INTERVAL = timedelta(seconds=30)


def _batch(saga_id: str, due_in: timedelta) -> WriteSet:
    due = datetime.now(UTC) + due_in
    return WriteSet(
        sagas=[SagaWrite("t", saga_id, {}, ACTIVE, 1, None, None)],
        deadline_inserts=[
            DeadlineInsert(
                f"0190{abs(hash(saga_id)):028x}"[:32], "t", saga_id, "timeout", due, None, "in", 0
            )
        ],
    )


def test_only_a_batch_with_a_deadline_due_within_the_interval_notifies(
    database_url: str, pg_schema: str
) -> None:
    tables = Tables(pg_schema)
    ensure_schema(database_url, tables)
    with (
        psycopg.connect(database_url, autocommit=True) as listener,
        connect(database_url) as conn,
    ):
        store = BatchStore(conn, tables, "g", wake_within=INTERVAL)
        listener.execute(f'LISTEN "{store.deadline_channel}"')
        with conn.transaction():
            store.write(_batch("far", timedelta(minutes=30)), [])
        with conn.transaction():
            store.write(_batch("near", timedelta(seconds=5)), [])
        # A marker after both commits: notifications arrive in commit order, so every one the
        # two batches sent has arrived once the marker has.
        listener.execute("SELECT pg_notify(%s, 'marker')", (store.deadline_channel,))
        seen: list[str] = []

        def marker_arrived() -> bool:
            seen.extend(n.payload for n in listener.notifies(timeout=0.5, stop_after=1))
            return "marker" in seen

        wait_until(marker_arrived, what="the marker notification")
        assert seen == ["", "marker"]
