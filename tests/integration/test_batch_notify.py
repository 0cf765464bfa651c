"""Which batches notify the loops of other processes, against a real PostgreSQL.

A batch of far-off deadlines (the common payment timeout of half an hour) leaves the poller
asleep: its next planned look, at most one polling interval away, finds them in time. A batch
with a deadline due within that interval notifies every replica's poller, as before. A
replica's listener skips the notifications of its own commits, which woke its loops in-process.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Generator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from processor._engine.rows import ACTIVE, DeadlineInsert, SagaWrite, WriteSet
from processor._postgres.batch.store import BatchSql
from processor._postgres.connect import connect, ensure_schema
from processor._postgres.notify import PostgresWakeSource
from processor._postgres.schema.tables import Tables
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
        store = BatchSql(conn, tables, "g", wake_within=INTERVAL)
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


class _Recording(psycopg.Connection[Any]):
    """A connection that records the payload of each notification it hands out."""

    consumed: list[str]

    def notifies(self, *args: Any, **kwargs: Any) -> Generator[psycopg.Notify, None, None]:
        for n in super().notifies(*args, **kwargs):
            self.consumed.append(n.payload)
            yield n


def test_a_listener_skips_its_own_processes_notifications(database_url: str) -> None:
    channel = f"wake-{uuid.uuid4().hex[:8]}"
    consumed: list[str] = []

    def connect_recording() -> psycopg.Connection[Any]:
        conn = _Recording.connect(database_url, autocommit=True)
        conn.consumed = consumed
        return conn

    wakes: list[int] = []
    source = PostgresWakeSource(connect_recording, channel, ignore="me")
    stop = threading.Event()
    thread = threading.Thread(
        target=source.run, args=(stop, lambda: wakes.append(len(consumed))), daemon=True
    )
    thread.start()
    try:
        with psycopg.connect(database_url, autocommit=True) as sender:
            # LISTEN runs on the listener's own connection: notify until it has heard one.
            def heard() -> bool:
                sender.execute("SELECT pg_notify(%s, 'me')", (channel,))
                return bool(consumed)

            wait_until(heard, what="the listener to listen")
            for payload in ("other", "me", "me", "last"):
                sender.execute("SELECT pg_notify(%s, %s)", (channel, payload))
            wait_until(lambda: "last" in consumed and len(wakes) >= 2, what="the last notification")
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    # Warm-up notifications (own, skipped) may still arrive before "other", never after it.
    assert consumed[-4:] == ["other", "me", "me", "last"]
    # Woken by the other process's notifications only, each as it was handed out.
    assert wakes == [len(consumed) - 3, len(consumed)]
