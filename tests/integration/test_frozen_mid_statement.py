"""A replica frozen while sending a statement keeps its rows until the next owner ends it.

The server ends a session idle in its transaction, but not one whose client froze halfway
through a statement, inside a pipeline, or right after one (processor/_postgres/stuck.py). Here a
session holds a partition's offsets row and then, over the wire protocol, sends what a process
stopped there has sent: a whole Parse message and a Bind message cut short; a pipelined
statement up to its Flush and no Sync; or a pipelined statement, its Sync and psycopg's flush
request after it. The next owner's claim finds the rows busy, ends that session once it has sat
so past the bound, and claims on its next try.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from datetime import timedelta

import psycopg
import pytest

from processor._errors import LockBusy
from processor._postgres.batch import store as batch_store
from processor._postgres.batch.store import BatchSql
from processor._postgres.connect import connect, ensure_schema
from processor._postgres.schema.tables import Tables
from tests.support.harness import wait_until
from tests.support.phases import CITUS_BUCKETS, CITUS_LAYOUT

pytestmark = pytest.mark.integration

GROUP = "frozen-mid-statement"
TP = ("events", 0)
# The server's own bound on a session idle in its transaction: shorter than the waits below,
# to show it is not what ends the frozen session.
IDLE_LIMIT = timedelta(seconds=1)


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


def freeze_mid_statement(conn: psycopg.Connection[object]) -> None:
    """Sends a Parse, then a Bind announcing 100 kB of which only ten bytes arrive."""
    parse = _message(b"P", b"\0SELECT $1::text\0" + struct.pack("!H", 0))
    announced = 100_000
    head = b"\0\0" + struct.pack("!HHI", 0, 1, announced)
    bind = b"B" + struct.pack("!I", 4 + len(head) + announced + 2) + head + b"x" * 10
    os.write(conn.pgconn.socket, parse + bind)


def _pipelined(end: bytes) -> bytes:
    """A statement as a pipeline sends it (Parse, Bind, Execute), then ``end``."""
    parse = _message(b"P", b"\0SELECT 1\0" + struct.pack("!H", 0))
    bind = _message(b"B", b"\0\0" + struct.pack("!HHH", 0, 0, 0))
    execute = _message(b"E", b"\0" + struct.pack("!I", 0))
    return parse + bind + execute + end


def freeze_mid_pipeline(conn: psycopg.Connection[object]) -> None:
    """Runs a statement of a pipeline up to its Flush, and sends no Sync."""
    os.write(conn.pgconn.socket, _pipelined(_message(b"H", b"")))


def freeze_after_pipeline(conn: psycopg.Connection[object]) -> None:
    """Ends a pipeline as psycopg does, a Sync then a flush request, and sends nothing more."""
    os.write(conn.pgconn.socket, _pipelined(_message(b"S", b"") + _message(b"H", b"")))


Freeze = Callable[[psycopg.Connection[object]], None]
# How the session each one leaves shows in pg_stat_activity.
STATES: dict[Freeze, str] = {
    freeze_mid_statement: "active",
    freeze_mid_pipeline: "active",
    freeze_after_pipeline: "idle in transaction",
}


def stuck_for(database_url: str, pid: int, state: str) -> float:
    """Seconds the session has sat in ``state`` waiting on its client; 0 if it is not so."""
    with psycopg.connect(database_url, autocommit=True) as c:
        row = c.execute(
            "SELECT extract(epoch FROM now() - state_change) FROM pg_stat_activity"
            " WHERE pid = %s AND state = %s AND wait_event = 'ClientRead'",
            (pid, state),
        ).fetchone()
    return float(row[0]) if row else 0.0


@pytest.fixture
def tables(database_url: str, pg_schema: str) -> Tables:
    t = Tables(schema=pg_schema)
    if os.environ.get(CITUS_LAYOUT) == "buckets":
        ensure_schema(database_url, t, "buckets", buckets=CITUS_BUCKETS)
    else:
        ensure_schema(database_url, t)
    return t


@pytest.fixture(params=list(STATES), ids=lambda f: f.__name__)
def frozen(
    request: pytest.FixtureRequest, database_url: str, tables: Tables
) -> Iterator[tuple[int, str]]:
    """The old owner's session, holding the partition's offsets row, frozen where the parameter
    leaves it: its pid, and how it shows."""
    freeze: Freeze = request.param
    with connect(database_url, application_name="saga:old") as conn:
        BatchSql(conn, tables, GROUP).claim([TP], "old")
    conn = connect(
        database_url, application_name="saga:old", idle_in_transaction_timeout=IDLE_LIMIT
    )
    try:
        conn.execute(
            tables.render("UPDATE {offsets} SET next_offset = 1 WHERE group_id = %s"), (GROUP,)
        )
        pid = conn.pgconn.backend_pid
        freeze(conn)
        yield pid, STATES[freeze]
    finally:
        conn.close()


Claimed = dict[tuple[str, int], tuple[int, int | None]]


def heir_claim(database_url: str, tables: Tables, stuck_after: timedelta | None) -> Claimed:
    with connect(database_url, application_name="saga:heir") as conn:
        return BatchSql(conn, tables, GROUP, stuck_after=stuck_after).claim([TP], "heir")


def test_a_claim_ends_a_session_frozen_mid_statement_past_the_bound(
    database_url: str,
    tables: Tables,
    frozen: tuple[int, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pid, state = frozen
    # The claim's lock wait, shortened: each try below waits it out once.
    monkeypatch.setattr(batch_store, "CLAIM_LOCK_TIMEOUT_MS", 300)
    # Past the server's idle bound, and the session is still there, holding the row.
    wait_until(
        lambda: stuck_for(database_url, pid, state) > 2 * IDLE_LIMIT.total_seconds(),
        timeout=30,
        what="the frozen session to outlive the idle bound",
    )

    # Within the bound (or with no bound) the claim only names the holder.
    for bound in (None, timedelta(minutes=5)):
        with pytest.raises(LockBusy) as busy:
            heir_claim(database_url, tables, bound)
        assert f"pid {pid} (saga:old, {state}, waiting on ClientRead" in str(busy.value)
        assert "ended" not in str(busy.value)
        assert stuck_for(database_url, pid, state) > 0

    # Past it, the claim ends the session, and the next try claims.
    with pytest.raises(LockBusy) as busy:
        heir_claim(database_url, tables, IDLE_LIMIT)
    assert f"ended pid {pid} (saga:old)" in str(busy.value)
    claimed = wait_until(
        lambda: _claimed(database_url, tables),
        timeout=30,
        what="the heir's claim once the frozen session is ended",
    )
    assert claimed[TP][0] == 2


def _claimed(database_url: str, tables: Tables) -> Claimed:
    try:
        return heir_claim(database_url, tables, IDLE_LIMIT)
    except LockBusy:
        return {}
