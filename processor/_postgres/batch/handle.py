"""The consumer's store port over PostgreSQL: one transaction per call, errors translated.

The SQL lives in :mod:`processor._postgres.batch.store`; this module owns the connection's life,
held by :class:`processor._postgres.held.HeldConnection`: a call whose connection broke raises a
runtime failure and drops the connection, and the next call opens a fresh one, so the loops
never hold a driver object.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

import psycopg

from processor._engine.records import OffsetCommit
from processor._engine.rows import Loaded, Wants, WriteSet
from processor._ports import TP, Positions
from processor._postgres.batch.store import BatchSql
from processor._postgres.colocation import Colocation
from processor._postgres.held import Conn, HeldConnection
from processor._postgres.schema.buckets import layout_mark
from processor._postgres.schema.tables import Tables


class PostgresBatchStore:
    """:class:`processor._ports.BatchStore` over PostgreSQL."""

    def __init__(
        self,
        connect: Callable[[], Conn],
        tables: Tables,
        group_id: str,
        wake_within: timedelta | None = None,
        origin: str = "",
        colocation: Colocation | None = None,
        stuck_after: timedelta | None = None,
    ) -> None:
        # A new connection, and statements made for the tables' layout, after they moved.
        self._held = HeldConnection(connect, layout=layout_mark(tables.schema))
        # Where each partition's bucket lives, kept current for the consumer's intake.
        self._colocation = colocation
        self._tables = tables
        self._group_id = group_id
        # See BatchSql: new deadlines due later than this wake no deadline poller.
        self._wake_within = wake_within
        # The payload of its notifications, which this process's listeners skip.
        self._origin = origin
        self._sql: BatchSql | None = None
        # See BatchSql: how long a replica's session may sit mid-statement holding our rows.
        self._stuck_after = stuck_after

    def _store(self) -> BatchSql:
        conn = self._held.get()
        if self._sql is None or self._sql.conn is not conn:
            self._sql = BatchSql(
                conn,
                self._tables,
                self._group_id,
                self._wake_within,
                self._origin,
                colocation=self._colocation,
                stuck_after=self._stuck_after,
            )
        return self._sql

    def claim(self, partitions: Sequence[TP], owner: str) -> Positions:
        with self._held.session():
            return self._store().claim(partitions, owner)

    def read_offsets(self, partitions: Sequence[TP]) -> Positions:
        with self._held.session():
            return self._store().read_offsets(partitions)

    def load(self, wants: Wants) -> Loaded:
        with self._held.session():
            return self._store().load_alone(wants)

    def write(
        self,
        ws: WriteSet,
        offsets: Sequence[OffsetCommit],
        *,
        before_commit: Callable[[], None] | None = None,
        dry_run: bool = False,
    ) -> None:
        committing = False
        try:
            store = self._store()
            with store.conn.transaction():
                store.write(ws, offsets)
                if dry_run:
                    raise psycopg.Rollback()
                if before_commit is not None:
                    before_commit()
                # Leaving the block sends COMMIT: a connection lost from here on leaves the
                # outcome unknown until the stored offsets are read again.
                committing = True
        except psycopg.Error as e:
            # Whatever the SQLSTATE (a lost socket, the server ending an idle session), a
            # dropped connection is worth another try on a fresh one; lost during COMMIT, the
            # outcome is unknown until the stored offsets are read again.
            raise self._held.failure(e, committing=committing) from e

    def close(self) -> None:
        self._held.close()
        self._sql = None
