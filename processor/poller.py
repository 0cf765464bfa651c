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
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import psycopg
from confluent_kafka import KafkaError, Producer
from psycopg import sql

from processor.engine.decode import DEADLINE_FIRED, HEADER_DEADLINE_ID, HEADER_DEADLINE_NAME, HEADER_FENCING_TOKEN
from processor.messages import HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE, HEADER_SAGA_ID, HEADER_SAGA_TYPE
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
        # Claims only while the lease is ours and unexpired, checked in this very statement.
        self._claim = r(
            """
            UPDATE {deadline} AS d SET dispatched_at = now(), dispatch_token = %(token)s
             WHERE d.id IN (
                   SELECT id FROM {deadline}
                    WHERE due_at <= now()
                      AND (dispatch_token IS DISTINCT FROM %(token)s
                           OR dispatched_at IS NULL
                           OR dispatched_at < now() - make_interval(secs => %(redispatch)s))
                    ORDER BY due_at
                    LIMIT %(limit)s
                    FOR UPDATE SKIP LOCKED)
               AND EXISTS (SELECT 1 FROM {deadline_lock}
                            WHERE name = %(name)s AND holder = %(holder)s
                              AND token = %(token)s AND expires_at > now())
            RETURNING d.id::text, d.saga_type, d.saga_id, d.name, d.topic, d.partition, d.due_at
            """
        )
        self._unclaim = r(
            """
            UPDATE {deadline} SET dispatched_at = NULL
             WHERE id = ANY(%s::uuid[]) AND dispatch_token = %s
            """
        )
        # Seconds until something needs this leader: an undispatched due time, or a redispatch.
        self._next = r(
            """
            SELECT extract(epoch FROM least(
                (SELECT min(due_at) FROM {deadline}
                  WHERE dispatch_token IS DISTINCT FROM %(token)s OR dispatched_at IS NULL),
                (SELECT min(dispatched_at) + make_interval(secs => %(redispatch)s) FROM {deadline}
                  WHERE dispatch_token = %(token)s)
            ) - now())
            """
        )

    # -- one step --------------------------------------------------------------------------

    def acquire(self, conn: Conn) -> int | None:
        """Takes or renews the lease; None when another holder's lease is still valid."""
        with conn.transaction():
            row = conn.execute(self._lease, self._lease_args).fetchone()
        token = int(row[0]) if row else None
        if token != self.token:
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
        with conn.transaction():
            rows = [Due(*r) for r in conn.execute(self._claim, args).fetchall()]
        if not rows:
            return 0
        failed = self._produce(rows, token)
        if failed:
            with conn.transaction():
                conn.execute(self._unclaim, (failed, token))
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
        with conn.transaction():
            row = conn.execute(
                self._next, {"token": token, "redispatch": self.settings.redispatch_after.total_seconds()}
            ).fetchone()
        return float(row[0]) if row and row[0] is not None else None

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
