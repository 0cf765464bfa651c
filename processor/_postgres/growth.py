"""The growth watch's store: partition counts a consumer group knows, its growths, its positions.

Replicas notice a growth independently; every write here is conditional (an insert that does
nothing on conflict, an update guarded by the value it expects, both under the count row's lock),
so the growth is recorded once, by whoever comes first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from processor._engine.growth import Growth, GrowthState, router
from processor._engine.partitioner import Partitioner
from processor._ports import TP
from processor._postgres.held import Conn, HeldConnection
from processor._postgres.schema.buckets import layout_mark
from processor._postgres.schema.tables import Tables

__all__ = ["PostgresGrowthStore", "current_router"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class PostgresGrowthStore:
    """:class:`processor._ports.GrowthStore` over one connection, opened on first use.

    A psycopg error becomes a runtime failure by the rule of
    :class:`processor._postgres.held.HeldConnection` (``Retryable`` for a lost connection).

    Args:
        connect: Opens a new connection (not in autocommit).
        tables: The processor's table names.
    """

    def __init__(self, connect: Callable[[], Conn], tables: Tables) -> None:
        self._held = HeldConnection(connect, layout=layout_mark(tables.schema))
        r = tables.render
        self._now = "SELECT now()"
        self._counts = r("SELECT topic, count FROM {partition_count} WHERE group_id = %s")
        self._growths = r(
            """
            SELECT topic, old_count, new_count, noticed_at
              FROM {partition_growth} WHERE group_id = %s ORDER BY topic, new_count
            """
        )
        self._baseline = r(
            """
            INSERT INTO {partition_count} (group_id, topic, count) VALUES (%s, %s, %s)
            ON CONFLICT (group_id, topic) DO NOTHING
            """
        )
        self._lock_count = r(
            "SELECT count FROM {partition_count} WHERE group_id = %s AND topic = %s FOR UPDATE"
        )
        self._insert_growth = r(
            """
            INSERT INTO {partition_growth}
                   (group_id, topic, old_count, new_count, noticed_at, barrier_at)
            VALUES (%(g)s, %(t)s, %(old)s, %(new)s, now(), now())
            ON CONFLICT (group_id, topic, new_count) DO NOTHING
            """
        )
        self._set_count = r(
            """
            UPDATE {partition_count} SET count = %(new)s, updated_at = now()
             WHERE group_id = %(g)s AND topic = %(t)s
            """
        )
        self._committed = r(
            """
            SELECT topic, partition, next_offset FROM {offsets}
             WHERE group_id = %s AND topic = ANY(%s)
            """
        )

    def load(self, group_id: str) -> GrowthState:
        def run(conn: Conn) -> GrowthState:
            now_row = conn.execute(self._now).fetchone()
            assert now_row is not None
            counts = {str(t): int(c) for t, c in conn.execute(self._counts, (group_id,))}
            growths = tuple(
                Growth(topic=t, old_count=int(old), new_count=int(new), noticed_at=noticed)
                for t, old, new, noticed in conn.execute(self._growths, (group_id,))
            )
            return GrowthState(now=now_row[0], counts=counts, growths=growths)

        return self._run(run)

    def baseline(self, group_id: str, topic: str, count: int) -> None:
        self._run(lambda conn: conn.execute(self._baseline, (group_id, topic, count)))

    def grow(self, group_id: str, topic: str, old_count: int, new_count: int) -> bool:
        def run(conn: Conn) -> bool:
            # The count row's lock orders replicas recording the same growth: the second one
            # finds the count moved on and records nothing.
            row = conn.execute(self._lock_count, (group_id, topic)).fetchone()
            if row is None or int(row[0]) != old_count:
                return False
            args = {"g": group_id, "t": topic, "old": old_count, "new": new_count}
            conn.execute(self._insert_growth, args)
            conn.execute(self._set_count, args)
            return True

        return self._run(run)

    def committed(self, group_id: str, topics: Sequence[str]) -> dict[TP, int | None]:
        def run(conn: Conn) -> dict[TP, int | None]:
            rows = conn.execute(self._committed, (group_id, list(topics)))
            return {(str(t), int(p)): (None if n is None else int(n)) for t, p, n in rows}

        return self._run(run)

    def _run(self, fn: Callable[[Conn], _T]) -> _T:
        with self._held.session() as conn, conn.transaction():
            return fn(conn)

    def close(self) -> None:
        """Closes the connection; the next call opens a new one."""
        self._held.close()


def current_router(
    connect: Callable[[], Conn], tables: Tables, group_id: str, partitioner: Partitioner
) -> Callable[[str, bytes, int], int]:
    """Where a saga's records go now, from the counts and growths the group has recorded.

    For one-off senders (operator requests): the replicas' growth watch keeps its own view.
    """
    store = PostgresGrowthStore(connect, tables)
    try:
        return router(store.load(group_id), partitioner)
    finally:
        store.close()
