"""The relay's side of the store in PostgreSQL: claim committed outbox rows, in id order.

A claim is one transaction on the adapter's own connection. It first takes a transaction-scoped
advisory lock, so that one relay at a time publishes across all replicas and a saga's row n+1
can never overtake row n in another process. It then deletes up to ``limit`` rows and returns
them; the delete commits only when the caller's block ends normally, after every record was
acknowledged. Rows are claimed by what is committed, never by "id > last seen", so a row that a
slower transaction commits late is not skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

from processor.engine.records import OutboxRow
from processor.errors import Retryable
from processor.ports import OutboxEntry
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
            DELETE FROM {outbox} WHERE id IN
                (SELECT id FROM {outbox} ORDER BY id LIMIT %s FOR UPDATE)
            RETURNING id, saga_type, saga_id, topic, partition, key, headers, value
            """
        )

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
                yield [
                    OutboxEntry(
                        id=id_,
                        row=OutboxRow(
                            saga_type=saga_type,
                            saga_id=saga_id,
                            topic=topic,
                            key=key,
                            headers=headers,
                            value=value,
                            partition=partition,
                        ),
                    )
                    for id_, saga_type, saga_id, topic, partition, key, headers, value in rows
                ]
        except psycopg.Error as e:
            failure = translate(e)
            if conn.broken or conn.closed:
                # Whatever the server said last (e.g. its idle-in-transaction timeout ended the
                # session), this connection is gone and the next call can only reconnect.
                failure = Retryable(f"database connection lost: {failure}")
            if isinstance(failure, Retryable):
                self._drop()
            raise failure from e

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
