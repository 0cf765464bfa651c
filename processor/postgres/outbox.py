"""The relay's side of the store in PostgreSQL: claim committed outbox rows, in id order.

A claim is one transaction on the adapter's own connection. It first takes a transaction-scoped
advisory lock, so that one relay at a time publishes across all replicas and a saga's row n+1
can never overtake row n in another process. It then deletes up to ``limit`` rows and returns
them; the delete commits only when the caller's block ends normally, after every record was
acknowledged. Rows are claimed by what is committed, never by "id > last seen", so a row that a
slower transaction commits late is not skipped.

Rows the relay does not publish are settled in the same transaction: put back under their own
id (one more attempt counted), or moved to the failed outbox. Each claimed row says whether its
saga already has a row in the failed outbox, so that it is held behind it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import psycopg
from psycopg.types.json import Jsonb

from processor.engine.records import OutboxRow
from processor.errors import Retryable
from processor.ports import OutboxEntry, SetAside
from processor.postgres.errors import translate
from processor.postgres.schema import Tables
from processor.postgres.store import Conn

__all__ = ["PostgresOutboxStore"]

log = logging.getLogger(__name__)


class PostgresOutboxStore:
    """:class:`processor.ports.OutboxStore` over one PostgreSQL connection.

    The connection is opened on first use and again on the call after one broke; the call that
    met the break raises ``Retryable``.

    Args:
        connect: Opens a new connection (not in autocommit mode).
        tables: Where the processor's tables live.
    """

    def __init__(self, connect: Callable[[], Conn], tables: Tables) -> None:
        self._connect = connect
        self._conn: Conn | None = None
        self._lock_key = f"saga-relay:{tables.schema}"
        self._claim = tables.render(
            """
            DELETE FROM {outbox} AS o WHERE id IN
                (SELECT id FROM {outbox} ORDER BY id LIMIT %s FOR UPDATE)
            RETURNING id, saga_type, saga_id, topic, partition, key, headers, value, attempts,
                (SELECT min(f.id) FROM {failed_outbox} AS f
                  WHERE o.saga_id IS NOT NULL
                    AND f.saga_type = o.saga_type AND f.saga_id = o.saga_id),
                created_at
            """
        )
        # A kept row goes back under its own id: its place in the commit order stays.
        self._keep = tables.render(
            """
            INSERT INTO {outbox} (id, saga_type, saga_id, topic, partition, key, headers, value,
                                  created_at, attempts, last_error)
            OVERRIDING SYSTEM VALUE
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            """
        )
        self._move = tables.render(
            """
            INSERT INTO {failed_outbox} (id, saga_type, saga_id, topic, partition, key, headers,
                                         value, created_at, reason, attempts, held_behind)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            """
        )
        self._claimed: dict[int, tuple[OutboxEntry, object]] = {}

    @contextmanager
    def claim(self, limit: int) -> Iterator[list[OutboxEntry] | None]:
        """Claims up to ``limit`` committed rows in id order, as one transaction.

        Yields None when another relay holds the lock. Leaving the block normally commits the
        delete; leaving it with an exception rolls it back and every row stays.

        Raises:
            Retryable: The database is unreachable or the connection broke; the next call
                reconnects.
            RuntimeFailure: Any other database error (fatal).
        """
        conn = self._connection()
        try:
            with conn.transaction():
                locked = conn.execute(
                    "SELECT pg_try_advisory_xact_lock(hashtext(%s))", (self._lock_key,)
                ).fetchone()
                if not locked or not locked[0]:
                    yield None
                    return
                rows = conn.execute(self._claim, (limit,)).fetchall()
                # DELETE ... RETURNING has no defined order: restore commit order by id.
                rows.sort(key=lambda r: r[0])
                self._claimed = {
                    r[0]: (
                        OutboxEntry(
                            id=r[0],
                            row=OutboxRow(
                                saga_type=r[1],
                                saga_id=r[2],
                                topic=r[3],
                                key=r[5],
                                headers=r[6],
                                value=r[7],
                                partition=r[4],
                            ),
                            attempts=r[8],
                            behind=r[9],
                        ),
                        r[10],
                    )
                    for r in rows
                }
                try:
                    yield [entry for entry, _created in self._claimed.values()]
                finally:
                    self._claimed = {}
        except psycopg.Error as e:
            failure = translate(e)
            if conn.broken or conn.closed:
                # Whatever the server said last (e.g. its idle-in-transaction timeout ended the
                # session), this connection is gone and the next call can only reconnect.
                failure = Retryable(f"database connection lost: {failure}")
            if isinstance(failure, Retryable):
                self._drop()
            raise failure from e

    def settle(self, set_aside: Sequence[SetAside], kept: Mapping[int, str | None]) -> None:
        """Within an open claim: puts ``kept`` rows back, moves ``set_aside`` ones aside.

        The claim's block, which this is called in, translates any database error.
        """
        if not self._claimed:
            raise RuntimeError("settle() outside an open claim")
        # Driver errors propagate to the claim, which rolls back and translates them.
        with self._connection().cursor() as cur:
            if kept:
                cur.executemany(
                    self._keep,
                    [
                        (*self._columns(i), self._claimed[i][0].attempts + bool(reason), reason)
                        for i, reason in kept.items()
                    ],
                )
            if set_aside:
                cur.executemany(
                    self._move,
                    [
                        (*self._columns(s.id), s.reason, s.attempts, s.held_behind)
                        for s in set_aside
                    ],
                )

    def _columns(self, row_id: int) -> tuple[object, ...]:
        entry, created_at = self._claimed[row_id]
        r = entry.row
        headers = Jsonb(dict(r.headers))
        return (
            row_id,
            r.saga_type,
            r.saga_id,
            r.topic,
            r.partition,
            r.key,
            headers,
            r.value,
            created_at,
        )

    def _connection(self) -> Conn:
        if self._conn is None:
            try:
                self._conn = self._connect()
            except psycopg.Error as e:
                raise translate(e) from e
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error as e:
                log.debug("closing a broken relay connection: %s", e)

    def close(self) -> None:
        """Closes the connection; a later claim would open a new one."""
        self._drop()
