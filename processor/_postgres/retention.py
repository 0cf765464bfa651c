"""The retention loop's store: chunked deletes of old rows, one short transaction each.

Every statement deletes at most ``limit`` rows found through an index in age order (ids or keys
picked by a subquery with LIMIT), so no call holds many locks for long or bloats the latency of
the consumer's batches. A transaction-scoped advisory lock makes one replica's retention run at
a time; a replica that finds it taken skips its round. Ages are measured by the database's clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from psycopg.types.numeric import Int4

from processor._engine.buckets import Buckets
from processor._ports import Purge
from processor._postgres.held import Conn, HeldConnection
from processor._postgres.schema.buckets import layout_mark
from processor._postgres.schema.tables import Tables

__all__ = ["PostgresRetentionStore"]

log = logging.getLogger(__name__)

# A chunk waits at most this long for a row lock (a batch writing the same saga): it gives way
# and the next round tries again, rather than queueing the consumer behind it.
LOCK_TIMEOUT = "1s"

# A history row of a saga that has not ended: kept (its audit trail, and the message ids that
# make redeliveries duplicates), however old.
_LIVE = """
    EXISTS (SELECT 1 FROM {instance} AS i
             WHERE i.saga_type = h.saga_type AND i.saga_id = h.saga_id
               AND i.status <> 'ended')
"""

_SQL: dict[Purge, str] = {
    # An ended saga's history goes first, at most `limit` rows a statement however long it is,
    # through the (saga_type, saga_id) index; the saga's row follows once none is left.
    Purge.ENDED_HISTORY: """
        DELETE FROM {history} WHERE id = ANY(ARRAY(
            SELECT h.id FROM (
                SELECT saga_type, saga_id FROM {instance}
                 WHERE status = 'ended' AND ended_at < now() - %(age)s
                 ORDER BY ended_at LIMIT %(limit)s) AS v
            CROSS JOIN LATERAL (
                SELECT id FROM {history} AS h
                 WHERE h.saga_type = v.saga_type AND h.saga_id = v.saga_id
                 LIMIT %(limit)s) AS h
             LIMIT %(limit)s))
        """,
    # The saga's row goes once its history is (nearly) gone; the tombstone keeps it ended for
    # the dedupe window. SKIP LOCKED: a row a batch or an operator holds is left for the next
    # round. The few history rows a late record may have added meanwhile go in this statement.
    Purge.ENDED_SAGAS: """
        WITH victims AS (
            SELECT saga_type, saga_id FROM {instance} AS s
             WHERE status = 'ended' AND ended_at < now() - %(age)s
               AND NOT EXISTS (
                   SELECT 1 FROM {history} AS x
                    WHERE x.saga_type = s.saga_type AND x.saga_id = s.saga_id
                   OFFSET 10)
             ORDER BY ended_at LIMIT %(limit)s
               FOR UPDATE SKIP LOCKED
        ), gone AS (
            DELETE FROM {instance} AS i USING victims AS v
             WHERE i.saga_type = v.saga_type AND i.saga_id = v.saga_id
            RETURNING i.saga_type, i.saga_id, i.ended_at
        ), history AS (
            DELETE FROM {history} AS h USING gone AS g
             WHERE h.saga_type = g.saga_type AND h.saga_id = g.saga_id
        )
        INSERT INTO {tombstone} AS t (saga_type, saga_id, ended_at, purged_at)
        SELECT saga_type, saga_id, ended_at, now() FROM gone
        ON CONFLICT (saga_type, saga_id) DO UPDATE
           SET ended_at = excluded.ended_at, purged_at = excluded.purged_at
        """,
    # Applied rows are the message-id detector; they stay for the dedupe window (below). An
    # operator record is decided by its other outcomes too (rows.DECIDED): purging those rows
    # after this period (days) is safe, a copy of the record being refused as expired minutes
    # after it was issued (SAGA_OPERATOR__EXPIRY).
    Purge.HISTORY: f"""
        DELETE FROM {{history}} WHERE id IN (
            SELECT id FROM {{history}} AS h
             WHERE outcome <> 'applied' AND at < now() - %(age)s AND NOT {_LIVE}
             ORDER BY at LIMIT %(limit)s)
        """,
    Purge.APPLIED: f"""
        DELETE FROM {{history}} WHERE id IN (
            SELECT id FROM {{history}} AS h
             WHERE at < now() - %(age)s AND NOT {_LIVE}
             ORDER BY at LIMIT %(limit)s)
        """,
    Purge.TOMBSTONES: """
        DELETE FROM {tombstone} WHERE (saga_type, saga_id) IN (
            SELECT saga_type, saga_id FROM {tombstone}
             WHERE ended_at < now() - %(age)s ORDER BY ended_at LIMIT %(limit)s)
        """,
    Purge.DEAD_LETTERS: """
        DELETE FROM {dead_letter} WHERE id IN (
            SELECT id FROM {dead_letter}
             WHERE created_at < now() - %(age)s ORDER BY created_at LIMIT %(limit)s)
        """,
    # Only a resolved saga's: a parked saga's held messages wait for its retry, however old.
    Purge.PARKED: """
        DELETE FROM {parked} WHERE id IN (
            SELECT p.id FROM {parked} AS p
             WHERE p.created_at < now() - %(age)s
               AND NOT EXISTS (
                   SELECT 1 FROM {instance} AS i
                    WHERE i.saga_type = p.saga_type AND i.saga_id = p.saga_id
                      AND i.status = 'parked')
             ORDER BY p.created_at LIMIT %(limit)s)
        """,
    Purge.FAILED_OUTBOX: """
        DELETE FROM {failed_outbox} WHERE id IN (
            SELECT id FROM {failed_outbox}
             WHERE failed_at < now() - %(age)s ORDER BY failed_at LIMIT %(limit)s)
        """,
}


B = "%(bucket)s::int"
# The same statements over tables distributed by bucket: every table they name is filtered to
# one bucket, so Citus routes each to one worker (it takes row locks and runs data-modifying
# CTEs only there); the store runs them bucket by bucket. Each pair must match its template.
_IN_BUCKET: dict[Purge, tuple[tuple[str, str], ...]] = {
    Purge.ENDED_HISTORY: (
        ("DELETE FROM {history} WHERE id", f"DELETE FROM {{history}} WHERE bucket = {B} AND id"),
        ("WHERE status = 'ended'", f"WHERE bucket = {B} AND status = 'ended'"),
        ("WHERE h.saga_type = v.saga_type", f"WHERE h.bucket = {B} AND h.saga_type = v.saga_type"),
    ),
    Purge.ENDED_SAGAS: (
        ("WHERE status = 'ended'", f"WHERE s.bucket = {B} AND status = 'ended'"),
        ("WHERE x.saga_type", f"WHERE x.bucket = {B} AND x.saga_type"),
        ("WHERE i.saga_type = v.saga_type", f"WHERE i.bucket = {B} AND i.saga_type = v.saga_type"),
        ("RETURNING i.saga_type", "RETURNING i.bucket, i.saga_type"),
        ("WHERE h.saga_type = g.saga_type", f"WHERE h.bucket = {B} AND h.saga_type = g.saga_type"),
        (
            "(saga_type, saga_id, ended_at, purged_at)",
            "(bucket, saga_type, saga_id, ended_at, purged_at)",
        ),
        (
            "SELECT saga_type, saga_id, ended_at, now() FROM gone",
            "SELECT bucket, saga_type, saga_id, ended_at, now() FROM gone",
        ),
        ("ON CONFLICT (saga_type, saga_id)", "ON CONFLICT (bucket, saga_type, saga_id)"),
    ),
    Purge.HISTORY: (
        ("DELETE FROM {history} WHERE id", f"DELETE FROM {{history}} WHERE bucket = {B} AND id"),
        ("WHERE outcome <> 'applied'", f"WHERE h.bucket = {B} AND outcome <> 'applied'"),
        ("WHERE i.saga_type", f"WHERE i.bucket = {B} AND i.saga_type"),
    ),
    Purge.APPLIED: (
        ("DELETE FROM {history} WHERE id", f"DELETE FROM {{history}} WHERE bucket = {B} AND id"),
        ("WHERE at < now()", f"WHERE h.bucket = {B} AND at < now()"),
        ("WHERE i.saga_type", f"WHERE i.bucket = {B} AND i.saga_type"),
    ),
    Purge.TOMBSTONES: (
        ("DELETE FROM {tombstone} WHERE", f"DELETE FROM {{tombstone}} WHERE bucket = {B} AND"),
        ("WHERE ended_at", f"WHERE bucket = {B} AND ended_at"),
    ),
    Purge.DEAD_LETTERS: (
        ("DELETE FROM {dead_letter} WHERE", f"DELETE FROM {{dead_letter}} WHERE bucket = {B} AND"),
        ("WHERE created_at", f"WHERE bucket = {B} AND created_at"),
    ),
    Purge.PARKED: (
        ("DELETE FROM {parked} WHERE", f"DELETE FROM {{parked}} WHERE bucket = {B} AND"),
        ("WHERE p.created_at", f"WHERE p.bucket = {B} AND p.created_at"),
        ("WHERE i.saga_type", f"WHERE i.bucket = {B} AND i.saga_type"),
    ),
    Purge.FAILED_OUTBOX: (
        (
            "DELETE FROM {failed_outbox} WHERE",
            f"DELETE FROM {{failed_outbox}} WHERE bucket = {B} AND",
        ),
        ("WHERE failed_at", f"WHERE bucket = {B} AND failed_at"),
    ),
}


def in_bucket(what: Purge) -> str:
    """:data:`_SQL`'s statement for ``what`` filtered to one bucket (``%(bucket)s``)."""
    text = _SQL[what]
    for old, new in _IN_BUCKET[what]:
        if old not in text:
            raise AssertionError(f"{what}: {old!r} is not in its statement")
        text = text.replace(old, new)
    return text


class PostgresRetentionStore:
    """:class:`processor._ports.RetentionStore` over one connection, opened on first use.

    A psycopg error becomes a runtime failure by the rule of
    :class:`processor._postgres.held.HeldConnection` (``Retryable`` for a lost connection or a
    lock not granted in time).

    Args:
        connect: Opens a new connection (not in autocommit).
        tables: The processor's table names.
    """

    def __init__(self, connect: Callable[[], Conn], tables: Tables) -> None:
        self._held = HeldConnection(connect, layout=layout_mark(tables.schema))
        self._lock_key = f"saga-retention:{tables.schema}"
        self._sql = {what: tables.render(text) for what, text in _SQL.items()}
        self._sql_b = {what: tables.render(in_bucket(what)) for what in _SQL}
        self._tables = tables

    def purge(self, what: Purge, older_than: timedelta, limit: int) -> int | None:
        if not self._held.buckets_read:
            with self._held.session() as conn, conn.transaction():
                self._held.buckets(conn, self._tables.schema)
        buckets = self._held.known_buckets
        if buckets is not None:
            return self._purge_by_bucket(buckets, what, older_than, limit)
        return self._purge(what, older_than, limit, self._sql[what], {})

    def _purge_by_bucket(
        self, buckets: Buckets, what: Purge, older_than: timedelta, limit: int
    ) -> int | None:
        """The chunk bucket by bucket, each a transaction on the bucket's worker.

        Until ``limit`` rows went; None when another replica's retention runs.
        """
        done = 0
        for b in range(buckets.count):
            params = {"bucket": Int4(buckets.key(b))}
            got = self._purge(what, older_than, limit - done, self._sql_b[what], params)
            if got is None:
                return None if done == 0 else done
            done += got
            if done >= limit:
                break
        return done

    def _purge(
        self, what: Purge, older_than: timedelta, limit: int, text: str, extra: dict[str, Any]
    ) -> int | None:
        with self._held.session() as conn, conn.transaction():
            row = conn.execute(
                "SELECT pg_try_advisory_xact_lock(hashtext(%s))", (self._lock_key,)
            ).fetchone()
            if row is None or not row[0]:
                return None
            conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            cur = conn.execute(text, {"age": older_than, "limit": limit, **extra})
            return max(cur.rowcount, 0)

    def close(self) -> None:
        """Closes the connection; the next call opens a new one."""
        self._held.close()
