"""SQL behind the operator services: deadline and state views, parked sagas and their retry.

`OperatorQueries` implements both `processor._ports.OperatorStore` and
`processor._ports.ParkedStore` on one connection the caller owns.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from processor._engine.rows import Loaded, SagaRow, Wants, WriteSet
from processor._ports import DeadlineRow, HeldMessage, ParkedSaga, StateCount
from processor._postgres.batch.rows import held_message
from processor._postgres.batch.store import BatchSql
from processor._postgres.connect import connect
from processor._postgres.deadlines import DEADLINE_COLUMNS
from processor._postgres.held import Conn, OwnedConnection
from processor._postgres.schema.tables import Tables

__all__ = ["OperatorQueries", "open_operator_queries"]

_PENDING = f"""
    SELECT {DEADLINE_COLUMNS} FROM {{deadline}} WHERE saga_type = %s AND saga_id = %s
     ORDER BY due_at, name
"""
_OVERDUE = f"""
    SELECT {DEADLINE_COLUMNS} FROM {{deadline}}
     WHERE due_at <= coalesce(%s::timestamptz, now()) ORDER BY due_at, id LIMIT %s
"""
_STATES = """
    SELECT saga_type, machine_state, count(*),
           now() - min(coalesce(machine_state_since, created_at))
      FROM {instance}
     WHERE machine_state IS NOT NULL AND (%s::text IS NULL OR saga_type = %s::text)
     GROUP BY saga_type, machine_state
     ORDER BY saga_type, machine_state
"""
_PARKED = """
    SELECT i.saga_type, i.saga_id, i.parked_reason, count(p.id), i.version, i.updated_at
      FROM {instance} AS i
      LEFT JOIN {parked} AS p ON p.saga_type = i.saga_type AND p.saga_id = i.saga_id
     WHERE i.status = 'parked'
     GROUP BY i.saga_type, i.saga_id
     ORDER BY i.updated_at, i.saga_type, i.saga_id
     LIMIT %s
"""
_LOCK = """
    SELECT state, status, version, state_version FROM {instance}
     WHERE saga_type = %s AND saga_id = %s FOR UPDATE
"""
_HELD = """
    SELECT id, topic, partition, "offset", key, value, headers FROM {parked}
     WHERE saga_type = %s AND saga_id = %s ORDER BY id
"""
_RELEASE = "DELETE FROM {parked} WHERE id = ANY(%s::bigint[])"
_DISCARD = "DELETE FROM {instance} WHERE saga_type = %s AND saga_id = %s AND version = %s"


class OperatorQueries(OwnedConnection):
    """One method per operator query, on one connection the caller owns.

    Outside `transaction()` each query runs on its own (the connection is expected to be in
    autocommit mode, or idle); closing this object closes the connection.
    """

    def __init__(self, conn: Conn, tables: Tables) -> None:
        super().__init__(conn)
        r = tables.render
        self._pending = r(_PENDING)
        self._overdue = r(_OVERDUE)
        self._states = r(_STATES)
        self._parked = r(_PARKED)
        self._lock = r(_LOCK)
        self._held = r(_HELD)
        self._release = r(_RELEASE)
        self._discard = r(_DISCARD)
        # The retry loads and writes exactly as the consumer does; it commits no offsets, so
        # the consumer group plays no part.
        self._batch = BatchSql(conn, tables, group_id="")
        self._buckets = self._batch.buckets
        if self._buckets is not None:
            # Distributed by bucket: Citus joins two tables on their bucket only, and locks
            # rows only in a statement on one shard.
            self._parked = self._parked.replace(
                "ON p.saga_type = i.saga_type",
                "ON p.bucket = i.bucket AND p.saga_type = i.saga_type",
            ).replace("GROUP BY i.saga_type", "GROUP BY i.bucket, i.saga_type")
            self._lock = self._lock.replace(
                "WHERE saga_type", "WHERE bucket = %s::int AND saga_type"
            )

    # -- views ---------------------------------------------------------------------------------

    def pending_deadlines(self, saga_type: str, saga_id: str) -> list[DeadlineRow]:
        """Deadlines still scheduled for one saga instance, soonest first."""
        rows = self.conn.execute(self._pending, (saga_type, saga_id)).fetchall()
        return [DeadlineRow(*row) for row in rows]

    def overdue_deadlines(self, now: datetime | None, limit: int) -> list[DeadlineRow]:
        """Deadlines due at or before ``now`` (None: the database's now), oldest due first."""
        rows = self.conn.execute(self._overdue, (now, limit)).fetchall()
        return [DeadlineRow(*row) for row in rows]

    def machine_states(self, saga_type: str | None) -> list[StateCount]:
        """State machine sagas per (type, machine state), with the oldest age in the state."""
        rows = self.conn.execute(self._states, (saga_type, saga_type)).fetchall()
        # A row whose state changed after this statement's now() was taken has a negative age.
        return [StateCount(t, s, int(n), max(age, timedelta(0))) for t, s, n, age in rows]

    def parked_sagas(self, limit: int) -> list[ParkedSaga]:
        """Parked saga instances with how many messages each holds, longest parked first."""
        rows = self.conn.execute(self._parked, (limit,)).fetchall()
        return [ParkedSaga(t, i, reason, int(n), int(v), at) for t, i, reason, n, v, at in rows]

    # -- retry of a parked saga ----------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction; an exception leaving it rolls back every statement made inside."""
        with self.conn.transaction():
            yield

    def lock_saga(self, saga_type: str, saga_id: str) -> SagaRow | None:
        """The saga's row (state, status, version), locked until the transaction ends."""
        key = () if self._buckets is None else (self._buckets.of(saga_id),)
        found = self.conn.execute(self._lock, (*key, saga_type, saga_id)).fetchone()
        if found is None:
            return None
        state, status, version, state_version = found
        return SagaRow(saga_type, saga_id, state, status, int(version), None, int(state_version))

    def held_messages(self, saga_type: str, saga_id: str) -> list[HeldMessage]:
        """The records held behind the saga, in arrival order."""
        rows = self.conn.execute(self._held, (saga_type, saga_id)).fetchall()
        return [_held(row) for row in rows]

    def load(self, wants: Wants) -> Loaded:
        """Reads every row the planner needs, with the database's clock."""
        return self._batch.load(wants)

    def release_held(self, parked_ids: Sequence[int]) -> None:
        """Deletes these held records."""
        self.conn.execute(self._release, (list(parked_ids),))

    def discard_saga(self, saga_type: str, saga_id: str, version: int) -> None:
        """Deletes the saga's row if it is still at ``version``."""
        self.conn.execute(self._discard, (saga_type, saga_id, version))

    def write(self, ws: WriteSet) -> None:
        """Writes a planned batch without offsets; raises ConcurrentUpdate if a version moved."""
        self._batch.write(ws, [])


def open_operator_queries(url: str, tables: Tables) -> OperatorQueries:
    """Operator queries on a new autocommit connection of their own.

    Args:
        url: The processor's database URL.
        tables: The processor's table names.
    """
    conn = connect(url, application_name="saga-processor-ops", autocommit=True, pin=tables.schema)
    return OperatorQueries(conn, tables)


def _held(row: tuple[Any, ...]) -> HeldMessage:
    return held_message(row)
