"""The single active deadline poller.

Leadership is a lease row with a fencing token; every time comes from the database clock. A
sweep claims due deadlines in the same statement that checks the lease (holder, token, expiry),
commits the claim, then produces one deadline-fired record per deadline to the saga's own input
partition, so a timeout and a reply for one saga are decided in log order by the consumer. The
consumer applies a fired record only if its token is both the row's dispatch token and the
current lease token: a paused ex-leader's late records are no-ops.

Precision does not depend on the polling interval: the poller sleeps until the next due time and
is woken by NOTIFY whenever a batch commits new deadlines.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import psycopg
from confluent_kafka import KafkaError, Producer
from psycopg import sql

from processor.engine.decode import (
    DEADLINE_FIRED,
    HEADER_DEADLINE_ID,
    HEADER_DEADLINE_NAME,
    HEADER_FENCING_TOKEN,
)
from processor.messages import (
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_SAGA_ID,
    HEADER_SAGA_TYPE,
)
from processor.postgres.schema import Tables
from processor.postgres.store import LEASE_NAME, Conn
from processor.settings import DeadlineSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Due:
    id: str
    saga_type: str
    saga_id: str
    name: str
    topic: str
    partition: int
    due_at: datetime


class DeadlinePoller:
    """`step()` runs one lease-and-sweep; `run()` loops it with precise sleeps."""

    def __init__(
        self,
        *,
        connect: Callable[[], Conn],
        tables: Tables,
        producer_factory: Callable[[], Producer],
        holder: str,
        settings: DeadlineSettings,
    ) -> None:
        self._connect = connect
        self._producer_factory = producer_factory
        self.producer = producer_factory()
        self.holder = holder
        self.settings = settings
        self.channel = f"saga_deadline_{tables.schema}"
        self.token: int | None = None
        self.fired = 0
        self.wake = threading.Event()
        ttl = settings.lease_ttl.total_seconds()
        r = tables.render
        self._lease = r(
            """
            INSERT INTO {deadline_lock} AS l (name, holder, token, expires_at)
            VALUES (%(name)s, %(holder)s, 1, now() + make_interval(secs => %(ttl)s))
            ON CONFLICT (name) DO UPDATE
               SET holder = excluded.holder,
                   token = CASE WHEN l.holder = excluded.holder AND l.expires_at > now()
                                THEN l.token ELSE l.token + 1 END,
                   expires_at = excluded.expires_at
             WHERE l.holder = excluded.holder OR l.expires_at <= now()
            RETURNING token
            """
        )
        self._lease_args = {"name": LEASE_NAME, "holder": holder, "ttl": ttl}

        def claim(which: str) -> str:
            # Claims only while the lease is ours and unexpired, checked in this very statement.
            return r(
                """
                UPDATE {deadline} AS d SET dispatched_at = now(), dispatch_token = %(token)s
                 WHERE d.id IN (
                       SELECT id FROM {deadline}
                        WHERE due_at <= now() AND (WHICH)
                        ORDER BY due_at
                        LIMIT %(limit)s
                        FOR UPDATE SKIP LOCKED)
                   AND EXISTS (SELECT 1 FROM {deadline_lock}
                                WHERE name = %(name)s AND holder = %(holder)s
                                  AND token = %(token)s AND expires_at > now())
                RETURNING d.id::text, d.saga_type, d.saga_id, d.name, d.topic, d.partition,
                          d.due_at
                """.replace("WHICH", which)
            )

        # Every row this leader may fire: undispatched, dispatched under another token (an
        # earlier leader's), or dispatched so long ago that the record is presumed lost. Its
        # scan passes every fired row still in the table, so it runs only when stale rows can
        # exist: after the token changed, and when this leader's oldest dispatch goes stale.
        self._claim = claim(
            "dispatch_token IS DISTINCT FROM %(token)s OR dispatched_at IS NULL"
            " OR dispatched_at < now() - make_interval(secs => %(redispatch)s)"
        )
        # Only undispatched rows, through their own partial index: every other sweep costs the
        # same however many fired rows still wait for their handler.
        self._claim_fresh = claim("dispatched_at IS NULL")
        self._full_sweep = True
        self._unclaim = r(
            """
            UPDATE {deadline} SET dispatched_at = NULL
             WHERE id = ANY(%s::uuid[]) AND dispatch_token = %s
            """
        )
        # Seconds until the next deadline comes due. Asked right after a claim, which took every
        # due row it could (rows committed later with an earlier due time wake the poller by
        # NOTIFY), so only future rows matter: one step into the due_at index, however many rows
        # are pending.
        self._next_due = r(
            "SELECT extract(epoch FROM min(due_at) - now()) FROM {deadline} WHERE due_at > now()"
        )
        # Seconds until this leader's oldest dispatch may be sent again. Only due rows are ever
        # dispatched, so the due_at range bounds the scan to rows in flight, not the whole table.
        self._next_redispatch = r(
            """
            SELECT extract(epoch FROM min(dispatched_at) + make_interval(secs => %(redispatch)s)
                                      - now())
              FROM {deadline} WHERE due_at <= now() AND dispatch_token = %(token)s
            """
        )
        # Monotonic time at which dispatches may have gone stale; None: ask the database. New
        # dispatches only come later, so it is kept in memory instead of scanned for every step.
        self._redispatch_at: float | None = None
        # (monotonic time, seconds until the next due row) as the last short sweep saw it.
        self._due: tuple[float, float | None] | None = None
        self._unsent = False

    # -- one step --------------------------------------------------------------------------

    def acquire(self, conn: Conn) -> int | None:
        """Takes or renews the lease; None when another holder's lease is still valid."""
        with conn.transaction():
            row = conn.execute(self._lease, self._lease_args).fetchone()
        token = int(row[0]) if row else None
        if token != self.token:
            self._redispatch_at = None
            self._full_sweep = True
            if token is None:
                log.info("deadline lease lost by %s (token %s)", self.holder, self.token)
            else:
                log.info("deadline lease won by %s (token %d)", self.holder, token)
        self.token = token
        return token

    def sweep(self, conn: Conn, token: int) -> int:
        """Claims up to batch-size due deadlines and produces their fired records."""
        args = {
            **self._lease_args,
            "token": token,
            "limit": self.settings.polling.batch_size,
            "redispatch": self.settings.redispatch_after.total_seconds(),
        }
        stale = self._redispatch_at is None or time.monotonic() >= self._redispatch_at
        full = self._full_sweep or stale
        with conn.transaction():
            claim = self._claim if full else self._claim_fresh
            rows = [Due(*r) for r in conn.execute(claim, args).fetchall()]
            if len(rows) < self.settings.polling.batch_size:
                self._full_sweep = False
                # Same transaction, so the same now(): every row the claim left is due later.
                # Asked a moment after, a row coming due in between would wait for a wake-up.
                row = conn.execute(self._next_due).fetchone()
                due = float(row[0]) if row and row[0] is not None else None
                self._due = (time.monotonic(), due)
        if not rows:
            return 0
        if self._redispatch_at is not None:
            stale_at = time.monotonic() + self.settings.redispatch_after.total_seconds()
            self._redispatch_at = min(self._redispatch_at, stale_at)
        failed = self._produce(rows, token)
        if failed:
            with conn.transaction():
                conn.execute(self._unclaim, (failed, token))
            # Due again at once: the next step retries them rather than waiting for a wake-up.
            self._unsent = True
        self.fired += len(rows) - len(failed)
        return len(rows)

    def _produce(self, rows: list[Due], token: int) -> list[str]:
        failed: list[str] = []

        def delivered(err: KafkaError | None, msg: object, due: Due) -> None:
            if err is not None:
                failed.append(due.id)

        for due in rows:
            value = json.dumps(
                {
                    "saga_type": due.saga_type,
                    "saga_id": due.saga_id,
                    "deadline_id": due.id,
                    "name": due.name,
                    "token": token,
                    "due_at": due.due_at.isoformat(),
                }
            ).encode()
            headers: list[tuple[str, str | bytes | None]] = [
                (HEADER_MESSAGE_TYPE, DEADLINE_FIRED.encode()),
                (HEADER_MESSAGE_ID, f"deadline:{due.id}:{token}".encode()),
                (HEADER_SAGA_TYPE, due.saga_type.encode()),
                (HEADER_SAGA_ID, due.saga_id.encode()),
                (HEADER_DEADLINE_ID, due.id.encode()),
                (HEADER_DEADLINE_NAME, due.name.encode()),
                (HEADER_FENCING_TOKEN, str(token).encode()),
            ]
            while True:
                try:
                    self.producer.produce(
                        due.topic,
                        key=due.saga_id.encode(),
                        value=value,
                        partition=due.partition,
                        headers=headers,
                        on_delivery=_on_delivery(delivered, due),
                    )
                    break
                except BufferError:
                    self.producer.poll(0.05)
        if self.producer.flush(30) != 0:
            failed = [d.id for d in rows]
        if failed:
            log.warning("%d deadline-fired records not acknowledged; they are retried", len(failed))
            self.producer = self._producer_factory()
        return failed

    def seconds_until_next(self, conn: Conn, token: int) -> float | None:
        """Seconds until a deadline comes due or a dispatch goes stale; None when neither."""
        if self._unsent:
            self._unsent = False
            return 0.0
        now = time.monotonic()
        if self._redispatch_at is None or now >= self._redispatch_at:
            args = {"token": token, "redispatch": self.settings.redispatch_after.total_seconds()}
            with conn.transaction():
                row = conn.execute(self._next_redispatch, args).fetchone()
            stale = float(row[0]) if row and row[0] is not None else None
            self._redispatch_at = now + max(0.0, stale) if stale is not None else math.inf
        if self._due is None:
            with conn.transaction():
                row = conn.execute(self._next_due).fetchone()
            self._due = (now, float(row[0]) if row and row[0] is not None else None)
        seen_at, due = self._due
        self._due = None
        if due is not None:
            due -= now - seen_at
        redispatch = self._redispatch_at - now
        if due is None:
            return None if math.isinf(redispatch) else redispatch
        return min(due, redispatch)

    def step(self, conn: Conn) -> float:
        """Lease, sweep until drained; returns how long to sleep before the next step."""
        interval = self.settings.polling.interval.total_seconds()
        token = self.acquire(conn)
        if token is None:
            return interval
        while self.sweep(conn, token) == self.settings.polling.batch_size:
            pass
        nxt = self.seconds_until_next(conn, token)
        return interval if nxt is None else max(0.0, min(interval, nxt))

    # -- loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                with self._connect() as conn:
                    conn.autocommit = True
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    while not stop.is_set():
                        wait = self.step(conn)
                        self._sleep(conn, wait, stop)
            except psycopg.Error as e:
                log.warning("deadline poller reconnecting after: %s", e)
                self.token = None
                stop.wait(1.0)
        self.producer.flush(5)

    def _sleep(self, conn: Conn, seconds: float, stop: threading.Event) -> None:
        # Wake early on NOTIFY (a batch committed deadlines) or the in-process wake event.
        remaining = seconds
        while remaining > 0 and not stop.is_set() and not self.wake.is_set():
            chunk = min(remaining, 0.25)
            for _ in conn.notifies(timeout=chunk, stop_after=1):
                return
            remaining -= chunk
        self.wake.clear()


def _on_delivery(
    callback: Callable[[KafkaError | None, object, Due], None], due: Due
) -> Callable[[KafkaError | None, object], None]:
    # Binds the deadline now; a lambda in the loop would see only the last one.
    return lambda err, msg: callback(err, msg, due)
