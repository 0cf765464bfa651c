"""Reads the numbers behind the database-derived gauges (see processor/_observe/sampler.py).

Each statement is an aggregate over a table the processor keeps small (outbox, deadlines) or
one index walk; the saga instance counts scan the instance table, which is why they are sampled
on an interval rather than per scrape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from processor._ports.cluster import AGE_BUCKETS, DatabaseSample
from processor._postgres.held import Conn, HeldConnection
from processor._postgres.schema.buckets import layout_mark
from processor._postgres.schema.tables import Tables

_OUTBOX = """
    SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0) FROM {outbox}
"""
_DEADLINES = """
    SELECT count(*), count(*) FILTER (WHERE due_at <= now())
      FROM {deadline} WHERE dispatched_at IS NULL
"""
_INSTANCES = "SELECT saga_type, status, count(*) FROM {instance} GROUP BY saga_type, status"
_SINCE = "coalesce(machine_state_since, created_at)"
_MACHINES = f"""
    SELECT saga_type, machine_state, count(*),
           greatest(0, extract(epoch FROM now() - min({_SINCE}))),
           coalesce(sum(greatest(0, extract(epoch FROM now() - {_SINCE}))), 0),
           {
    ", ".join(
        f"count(*) FILTER (WHERE {_SINCE} >= now() - interval '{int(b)} seconds')"
        for b in AGE_BUCKETS
    )
}
      FROM {{instance}}
     WHERE machine_state IS NOT NULL AND status <> 'ended'
     GROUP BY saga_type, machine_state
"""
_OFFSETS = """
    SELECT topic, partition, next_offset FROM {offsets} WHERE group_id = %s AND owner = %s
"""
_VERSION = "SELECT coalesce(max(version), 0) FROM {version}"


class PostgresGauges:
    """Samples the processor's tables on its own connection (opened again after a failure).

    Args:
        connect: Opens a connection.
        tables: The processor's table names.
        group_id: The consumer group whose stored offsets are read.
        owner: This replica's name in the offsets table.
    """

    def __init__(
        self, connect: Callable[[], Conn], tables: Tables, group_id: str, owner: str
    ) -> None:
        self._held = HeldConnection(connect, setup=_autocommit, layout=layout_mark(tables.schema))
        self._group_id = group_id
        self._owner = owner
        r = tables.render
        self._sql = {
            k: r(v)
            for k, v in {
                "outbox": _OUTBOX,
                "deadlines": _DEADLINES,
                "instances": _INSTANCES,
                "machines": _MACHINES,
                "offsets": _OFFSETS,
                "version": _VERSION,
            }.items()
        }

    def sample(self) -> DatabaseSample:
        """One reading; raises the driver's error (the caller counts the sample as failed)."""
        try:
            return self._read(self._held.get())
        except Exception:
            self.close()
            raise

    def _read(self, conn: Conn) -> DatabaseSample:
        q = self._sql

        def one(name: str) -> Any:
            row = conn.execute(q[name]).fetchone()
            assert row is not None
            return row

        depth, age = one("outbox")
        pending, overdue = one("deadlines")
        (version,) = one("version")
        instances = {
            (str(t), str(s)): int(n) for t, s, n in conn.execute(q["instances"]).fetchall()
        }
        machines: dict[tuple[str, str], tuple[int, float]] = {}
        ages: dict[tuple[str, str], tuple[tuple[int, ...], float]] = {}
        for t, s, n, oldest, total, *buckets in conn.execute(q["machines"]).fetchall():
            machines[(str(t), str(s))] = (int(n), float(oldest))
            ages[(str(t), str(s))] = (tuple(int(b) for b in buckets), float(total))
        offsets = {
            (str(t), int(p)): (None if o is None else int(o))
            for t, p, o in conn.execute(q["offsets"], (self._group_id, self._owner)).fetchall()
        }
        return DatabaseSample(
            outbox_depth=int(depth),
            outbox_oldest_age=float(age),
            deadlines_pending=int(pending),
            deadlines_overdue=int(overdue),
            instances=instances,
            machine_states=machines,
            state_ages=ages,
            stored_offsets=offsets,
            schema_version=int(version),
        )

    def close(self) -> None:
        self._held.close()


def _autocommit(conn: Conn) -> None:
    # Each read is a statement of its own: no transaction stays open between samples.
    conn.autocommit = True
