"""A replica frozen while sending a statement keeps its rows until the next owner ends it.

The server ends a session idle in its transaction, but not one whose client froze halfway
through a statement (processor/_postgres/stuck.py). Here a session holds a partition's offsets
row and sends a whole Parse message and a Bind message cut short, over the wire protocol, as a
process stopped mid-send does. The next owner's claim finds the rows busy, ends that session
once it has sat so past the bound, and claims on its next try.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
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


def stuck_for(database_url: str, pid: int) -> float:
    """Seconds the session has sat "active" waiting on its client; 0 if it is not so."""
    with psycopg.connect(database_url, autocommit=True) as c:
        row = c.execute(
            "SELECT extract(epoch FROM now() - state_change) FROM pg_stat_activity"
            " WHERE pid = %s AND state = 'active' AND wait_event = 'ClientRead'",
            (pid,),
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


@pytest.fixture
def frozen(database_url: str, tables: Tables) -> Iterator[int]:
    """The old owner's session, holding the partition's offsets row, frozen mid-statement."""
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
        freeze_mid_statement(conn)
        yield pid
    finally:
        conn.close()


Claimed = dict[tuple[str, int], tuple[int, int | None]]


def heir_claim(database_url: str, tables: Tables, stuck_after: timedelta | None) -> Claimed:
    with connect(database_url, application_name="saga:heir") as conn:
        return BatchSql(conn, tables, GROUP, stuck_after=stuck_after).claim([TP], "heir")


def test_a_claim_ends_a_session_frozen_mid_statement_past_the_bound(
    database_url: str, tables: Tables, frozen: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claim's lock wait, shortened: each try below waits it out once.
    monkeypatch.setattr(batch_store, "CLAIM_LOCK_TIMEOUT_MS", 300)
    # Past the server's idle bound, and the session is still there, holding the row.
    wait_until(
        lambda: stuck_for(database_url, frozen) > 2 * IDLE_LIMIT.total_seconds(),
        timeout=30,
        what="the frozen session to outlive the idle bound",
    )

    # Within the bound (or with no bound) the claim only names the holder.
    for bound in (None, timedelta(minutes=5)):
        with pytest.raises(LockBusy) as busy:
            heir_claim(database_url, tables, bound)
        assert f"pid {frozen} (saga:old, active, waiting on ClientRead" in str(busy.value)
        assert "ended" not in str(busy.value)
        assert stuck_for(database_url, frozen) > 0

    # Past it, the claim ends the session, and the next try claims.
    with pytest.raises(LockBusy) as busy:
        heir_claim(database_url, tables, IDLE_LIMIT)
    assert f"ended pid {frozen} (saga:old)" in str(busy.value)
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
