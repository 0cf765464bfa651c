"""How many round trips a batch costs, against a real PostgreSQL.

Each round trip waits for the database (and, on a busy replica, for the interpreter's lock
after it), so a batch's cost must not grow with its statements: the load is one round trip, and
the write of a batch of new sagas is three (BEGIN; one statement with the offsets'
compare-and-set, the saga, history, outbox and deadline rows and the notifications; COMMIT),
whatever its size. Counted from libpq's protocol trace: one ReadyForQuery ends each round trip.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from psycopg import pq

from processor._engine.records import OffsetCommit, OutboxRow
from processor._engine.rows import (
    ACTIVE,
    DeadlineInsert,
    HistoryRow,
    Loaded,
    Outcome,
    SagaWrite,
    Wants,
    WriteSet,
)
from processor._postgres.batch.handle import PostgresBatchStore
from processor._postgres.batch.store import Conn
from processor._postgres.connect import connect, ensure_schema
from processor._postgres.schema.tables import Tables

TABLES = ("consumer_offset", "saga_instance", "saga_history", "outbox", "saga_deadline")


def _traced(conn: Conn, call: Callable[[], Any]) -> list[str]:
    """The protocol messages ``call`` exchanged on ``conn``, in order."""
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            call()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        messages: list[str] = []
        for line in trace.read().splitlines():
            # A statement's text may span lines; each message starts with its direction.
            if line.startswith(("F\t", "B\t")) or not messages:
                messages.append(line)
            else:
                messages[-1] += "\n" + line
        return messages


def _round_trips(lines: list[str]) -> int:
    return sum("ReadyForQuery" in line for line in lines)


def _batch(n: int, stored: int) -> WriteSet:
    """``n`` sagas, the first ``stored`` of them updated from version 1, the rest new."""
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
        did = f"0190{version:04x}{i:024x}"
        ws.deadline_inserts.append(DeadlineInsert(did, "t", sid, f"d{version}", due, None, "in", 0))
    return ws


def test_a_batch_loads_in_one_round_trip_and_writes_its_rows_in_one_statement(
    database_url: str, pg_schema: str
) -> None:
    tables = Tables(pg_schema)
    ensure_schema(database_url, tables)
    conn = connect(database_url, keyed=True)
    store = PostgresBatchStore(lambda: conn, tables, "g", wake_within=timedelta(seconds=30))
    try:
        store.claim([("in", 0)], "me")
        # Three new sagas; then those three updated beside 197 new ones.
        for size, stored, offsets in (
            (3, 0, [OffsetCommit("in", 0, 3, None, 1)]),
            (200, 3, [OffsetCommit("in", 0, 200, 3, 1)]),
        ):
            ws = _batch(size, stored)
            keys = {(s.saga_type, s.saga_id) for s in ws.sagas}
            mkeys = {(h.saga_type, h.saga_id, h.message_id) for h in ws.history}
            loaded: list[Loaded] = []
            wants = Wants(keys, mkeys, set())
            lines = _traced(conn, partial(lambda w, out: out.append(store.load(w)), wants, loaded))
            assert _round_trips(lines) == 1, lines
            assert len(loaded[0].sagas) == stored

            lines = _traced(conn, partial(store.write, ws, offsets))
            assert _round_trips(lines) == 3, lines
            parsed = [line for line in lines if "\tParse\t" in line]
            assert len(parsed) == 1
            assert all(t in parsed[0] for t in TABLES), parsed[0][:2000]
            assert parsed[0].count("pg_notify") == 2

        counts = conn.execute(
            tables.render(
                "SELECT (SELECT count(*) FROM {instance}), (SELECT count(*) FROM {history}),"
                " (SELECT count(*) FROM {outbox}), (SELECT count(*) FROM {deadline})"
            )
        ).fetchone()
        conn.rollback()
        assert counts == (200, 203, 203, 203)
        assert store.read_offsets([("in", 0)]) == {("in", 0): (1, 200)}
    finally:
        store.close()
