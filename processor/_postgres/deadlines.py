"""The deadline poller's store: the lease row, claims of due deadlines, and NOTIFY wake-ups.

Every time is the database's clock, so replicas with skewed clocks agree on who holds the lease
and on what is due. The lease check sits inside each claim statement: a holder whose lease
expired (paused, partitioned) claims nothing, whatever it believes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.numeric import Int4

from processor._engine.buckets import Buckets
from processor._ports import DeadlineRow
from processor._postgres.held import Conn, HeldConnection
from processor._postgres.schema.buckets import layout_mark
from processor._postgres.schema.tables import Tables
from processor._wire import deadline_channel

__all__ = ["DEADLINE_COLUMNS", "LEASE_NAME", "PostgresDeadlineStore"]

DEADLINE_COLUMNS = """
    id::text, saga_type, saga_id, name, due_at, payload, topic, partition, traceparent,
    tracestate, dispatched_at, dispatch_token
"""
"""The deadline table's columns in the order of :class:`processor._ports.DeadlineRow`'s fields."""

LEASE_NAME = "deadline-poller"
"""The lease row's name; the consumer reads its token to tell a current fired record from a
stale one."""

log = logging.getLogger(__name__)

# With tables by bucket, while some bucket's worker does not answer: seconds until the next
# claim (the next due time cannot be read over every bucket), and between warnings.
AWAY_RETRY_S = 1.0
AWAY_WARN_S = 30.0

# Longest single wait in conn.notifies, so `wake` and `stop` are noticed promptly.
_WAIT_CHUNK = 0.25


class PostgresDeadlineStore:
    """:class:`processor._ports.DeadlineStore` over one autocommit connection that LISTENs.

    The connection is opened on first use and held by
    :class:`processor._postgres.held.HeldConnection`: a call whose connection broke raises
    ``Retryable`` and the next call reconnects (and LISTENs again).

    Args:
        connect: Opens a new connection.
        tables: The processor's table names.
    """

    def __init__(self, connect: Callable[[], Conn], tables: Tables) -> None:
        self.channel = deadline_channel(tables.schema)
        self._held = HeldConnection(connect, setup=self._listen, layout=layout_mark(tables.schema))
        r = tables.render
        self._lease = r(
            """
            INSERT INTO {deadline_lock} AS l (name, holder, token, expires_at)
            VALUES (%(name)s, %(holder)s, 1, now() + make_interval(secs => %(ttl)s))
            -- "Expired" compares with the proposed expiry less the lease's length, which is
            -- now(): Citus allows only immutable functions in a conflict's WHERE. Through UTC,
            -- as timestamptz minus an interval depends on the session's time zone.
            ON CONFLICT (name) DO UPDATE
               SET holder = excluded.holder,
                   token = CASE WHEN l.holder = excluded.holder AND l.token = %(held)s
                                THEN l.token ELSE l.token + 1 END,
                   expires_at = excluded.expires_at
             WHERE (l.holder = excluded.holder AND l.token = %(held)s)
                OR l.expires_at <= ((excluded.expires_at AT TIME ZONE 'UTC')
                                    - make_interval(secs => %(ttl)s)) AT TIME ZONE 'UTC'
            RETURNING token
            """
        )

        def claim(which: str) -> str:
            # Claims only while the lease is ours and unexpired, checked in this very statement.
            return r(
                """
                UPDATE {deadline} AS d SET dispatched_at = now(), dispatch_token = %(token)s
                 WHERE d.id IN (
                       SELECT c.id FROM {deadline} AS c
                        WHERE c.due_at <= now() AND (WHICH)
                          -- A parked saga's deadlines wait for its retry; fired now, they
                          -- would only be held behind it, again and again.
                          AND NOT EXISTS (
                              SELECT 1 FROM {instance} AS i
                               WHERE i.saga_type = c.saga_type AND i.saga_id = c.saga_id
                                 AND i.status = 'parked')
                        ORDER BY c.due_at
                        LIMIT %(limit)s
                        FOR UPDATE SKIP LOCKED)
                   AND EXISTS (SELECT 1 FROM {deadline_lock}
                                WHERE name = %(name)s AND holder = %(holder)s
                                  AND token = %(token)s AND expires_at > now())
                RETURNING COLUMNS
                """.replace("WHICH", which).replace("COLUMNS", DEADLINE_COLUMNS)
            )

        # Every row this leader may fire: undispatched, or dispatched under another token (an
        # earlier leader's, whose records can no longer apply). Its scan passes every fired row
        # still in the table, so the poller asks for it only after the token changed. A record
        # consumed without effect is made due again by the consumer (dispatched_at = NULL).
        self._claim_full = claim(
            "c.dispatch_token IS DISTINCT FROM %(token)s OR c.dispatched_at IS NULL"
        )
        # Only undispatched rows, through their own partial index: every other sweep costs the
        # same however many fired rows still wait for their handler.
        self._claim_fresh = claim("c.dispatched_at IS NULL")

        # Tables distributed by bucket: Citus locks rows only in a statement routed to one
        # shard, so the claim names one bucket in each of its tables and runs bucket by bucket.
        def in_bucket(text: str) -> str:
            return (
                text.replace(" WHERE d.id IN (", " WHERE d.bucket = %(bucket)s::int AND d.id IN (")
                .replace(" WHERE c.due_at", " WHERE c.bucket = %(bucket)s::int AND c.due_at")
                .replace(" WHERE i.saga_type", " WHERE i.bucket = %(bucket)s::int AND i.saga_type")
            )

        self._claim_full_b = in_bucket(self._claim_full)
        self._claim_fresh_b = in_bucket(self._claim_fresh)
        self._tables = tables
        self._first_bucket = 0
        self._warned_at = -AWAY_WARN_S
        self._unclaim = r(
            """
            UPDATE {deadline} SET dispatched_at = NULL
             WHERE id = ANY(%s::uuid[]) AND dispatch_token = %s
            """
        )
        # Asked right after a claim, which took every due row it could (rows committed later
        # with an earlier due time wake the poller by NOTIFY), so only future rows matter, and
        # only undispatched ones: one step into the partial due_at index, however many rows
        # are pending.
        self._next_due = r(
            "SELECT extract(epoch FROM min(due_at) - now()) FROM {deadline}"
            " WHERE due_at > now() AND dispatched_at IS NULL"
        )

    # -- connection --------------------------------------------------------------------------

    def _listen(self, conn: Conn) -> None:
        conn.autocommit = True
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))

    # -- the port ----------------------------------------------------------------------------

    def acquire(self, holder: str, ttl_seconds: float, held: int | None = None) -> int | None:
        """Takes or renews the lease; its fencing token, or None while another holds it.

        Only the same holder passing the token it ``held`` renews (keeps the token; nobody else
        took the lease in between, or the token would have moved on). Any other caller, a
        restarted process under the same holder name included, waits for the lease to expire
        and then gets a new, larger token.
        """
        args = {"name": LEASE_NAME, "holder": holder, "ttl": ttl_seconds, "held": held}
        with self._held.session() as conn, conn.transaction():
            row = conn.execute(self._lease, args).fetchone()
        return int(row[0]) if row else None

    def claim_due(
        self, holder: str, token: int, limit: int, *, full: bool
    ) -> tuple[list[DeadlineRow], float | None]:
        """Claims due deadlines under ``token``; see :class:`processor._ports.DeadlineStore`."""
        args: dict[str, Any] = {
            "name": LEASE_NAME,
            "holder": holder,
            "token": token,
            "limit": limit,
        }
        due: float | None = None
        with self._held.session() as conn:
            buckets = self._layout(conn)
            if buckets is not None:
                return self._claim_by_bucket(conn, buckets, args, full=full)
            with conn.transaction():
                claim = self._claim_full if full else self._claim_fresh
                rows = [DeadlineRow(*r) for r in conn.execute(claim, args).fetchall()]
                if len(rows) < limit:
                    # Same transaction, so the same now(): every row the claim left is due
                    # later. Asked a moment after, a row coming due in between would wait for a
                    # wake-up.
                    due = _seconds(conn.execute(self._next_due).fetchone())
        return rows, due

    def _layout(self, conn: Conn) -> Buckets | None:
        return self._held.buckets(conn, self._tables.schema)

    def _claim_by_bucket(
        self, conn: Conn, buckets: Buckets, args: dict[str, Any], *, full: bool
    ) -> tuple[list[DeadlineRow], float | None]:
        """The claim one bucket at a time, each a transaction on that bucket's worker.

        The first bucket turns round from call to call, so that a limit reached in the first
        buckets does not keep the later ones waiting. The next due time is read after the last
        claim: a row that came due in between reads as due now, and the poller claims again.
        """
        claim = self._claim_full_b if full else self._claim_fresh_b
        limit = int(args["limit"])
        rows: list[DeadlineRow] = []
        start = self._first_bucket
        self._first_bucket = (start + 1) % buckets.count
        away: dict[int, psycopg.Error] = {}
        for step in range(buckets.count):
            bucket = (start + step) % buckets.count
            key = buckets.key(bucket)
            try:
                with conn.transaction():
                    found = conn.execute(
                        claim, {**args, "bucket": Int4(key), "limit": limit - len(rows)}
                    )
                    rows += [DeadlineRow(*r) for r in found.fetchall()]
            except psycopg.Error as e:
                if conn.broken or len(away) + 1 == buckets.count:
                    raise  # the database itself, not one worker: the poller's retry
                # A worker that does not answer holds back its buckets' deadlines only; what
                # the others claimed is fired (dispatched rows left unfired would wait for the
                # next leader).
                away[bucket] = e
                continue
            if len(rows) >= limit:
                return rows, None
        if away:
            self._warn_away(away)
            # The next due time reads every bucket: look again soon instead.
            return rows, AWAY_RETRY_S
        with conn.transaction():
            return rows, _seconds(conn.execute(self._next_due).fetchone())

    def _warn_away(self, away: dict[int, psycopg.Error]) -> None:
        now = time.monotonic()
        if now < self._warned_at + AWAY_WARN_S:
            return
        self._warned_at = now
        first = next(iter(away.values()))
        log.warning(
            "deadlines of buckets %s wait: their worker does not answer (%s); the other "
            "buckets' fire",
            sorted(away),
            str(first).splitlines()[0] if str(first) else type(first).__name__,
        )

    def unclaim(self, ids: Sequence[str], token: int) -> None:
        """Makes rows dispatched under ``token`` due again."""
        with self._held.session() as conn, conn.transaction():
            conn.execute(self._unclaim, (list(ids), token))

    def next_due_in(self) -> float | None:
        """Seconds until the next deadline not yet due comes due; None when none is pending."""
        with self._held.session() as conn, conn.transaction():
            return _seconds(conn.execute(self._next_due).fetchone())

    def wait(self, seconds: float, stop: threading.Event, wake: threading.Event) -> None:
        """Sleeps up to ``seconds``.

        Returns early on NOTIFY on the deadline channel (a batch committed deadlines), on
        ``wake`` (one in this process did) or on ``stop``.
        """
        remaining = seconds
        with self._held.session() as conn:
            while remaining > 0 and not stop.is_set() and not wake.is_set():
                chunk = min(remaining, _WAIT_CHUNK)
                for _ in conn.notifies(timeout=chunk, stop_after=1):
                    return
                remaining -= chunk

    def close(self) -> None:
        """Closes the connection; a later call opens a new one."""
        self._held.close()


def _seconds(row: tuple[Any, ...] | None) -> float | None:
    return float(row[0]) if row and row[0] is not None else None
