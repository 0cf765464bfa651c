"""Read-only queries for the preflight check (`saga-processor check`); nothing here writes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg

from processor._ports.operator import StoredSaga
from processor._postgres.colocation import Colocation
from processor._postgres.schema.buckets import read_layout
from processor._postgres.schema.citus import (
    distributed,
    installed,
    local_node,
    pinned_node,
    placement,
)
from processor._postgres.schema.tables import Tables, current_version
from processor._wire import HEADER_MESSAGE_TYPE, HEADER_SCHEMA_VERSION

__all__ = ["PostgresCheckSource"]


class PostgresCheckSource:
    """What the check reads from the processor's tables, on a connection the caller owns.

    Every read runs in one read-only repeatable-read transaction per call, so a check against a
    live database sees each table consistently and can never change a row.
    """

    def __init__(self, conn: psycopg.Connection[Any], tables: Tables) -> None:
        self.conn = conn
        self.tables = tables

    def buckets(self) -> int | None:
        """The bucket count the tables are distributed by; None when they are not."""
        with self.conn.transaction():
            if installed(self.conn) is None:
                return None
            layout = read_layout(self.conn, self.tables.schema)
        return layout.count if layout is not None else None

    def schema_version(self) -> int:
        """The migration the schema is at (0: none)."""
        with self.conn.transaction():
            return current_version(self.conn, self.tables)

    def unended_sagas(self, batch: int = 1000) -> Iterator[StoredSaga]:
        """Every saga that has not ended (active and parked), streamed in batches."""
        r = self.tables.render
        with self.conn.transaction():
            self.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            # Before the migration that adds it, every row was written at version 1.
            has_version = self.conn.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_schema = %s "
                "AND table_name = 'saga_instance' AND column_name = 'state_version'",
                (self.tables.schema,),
            ).fetchone()
            version = "state_version" if has_version else "1"
            with self.conn.cursor(name="saga_check") as cur:
                cur.itersize = batch
                cur.execute(
                    r(
                        f"SELECT saga_type, saga_id, state, {version}, status, machine_state, "
                        "parked_reason FROM {instance} WHERE status <> 'ended'"
                    )
                )
                for t, i, state, sv, status, ms, reason in cur:
                    yield StoredSaga(t, i, state, int(sv), status, ms, reason)

    def pending_deadlines(self) -> list[tuple[str, str, int]]:
        """(saga type, deadline name, count) of every deadline still scheduled."""
        with self.conn.transaction():
            rows = self.conn.execute(
                self.tables.render(
                    "SELECT saga_type, name, count(*) FROM {deadline} GROUP BY 1, 2 ORDER BY 1, 2"
                )
            ).fetchall()
        return [(t, n, int(c)) for t, n, c in rows]

    def parked_messages(self) -> list[tuple[str, str | None, str | None, int]]:
        """(saga type, message-type header, schema-version header, count) of held records."""
        with self.conn.transaction():
            rows = self.conn.execute(
                self.tables.render(
                    f"SELECT saga_type, headers->>'{HEADER_MESSAGE_TYPE}', "
                    f"headers->>'{HEADER_SCHEMA_VERSION}', "
                    "count(*) FROM {parked} GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
                )
            ).fetchall()
        return [(t, m, v, int(c)) for t, m, v, c in rows]

    def stored_partitions(self, group_id: str) -> dict[str, set[int]]:
        """The partitions of each topic the consumer group has stored offsets for."""
        with self.conn.transaction():
            rows = self.conn.execute(
                self.tables.render("SELECT topic, partition FROM {offsets} WHERE group_id = %s"),
                (group_id,),
            ).fetchall()
        out: dict[str, set[int]] = {}
        for topic, partition in rows:
            out.setdefault(topic, set()).add(int(partition))
        return out

    def distribution(self) -> str | None:
        """Where the tables live on a Citus cluster, in words; None on a plain PostgreSQL."""
        schema = self.tables.schema
        with self.conn.transaction():
            version = installed(self.conn)
            if version is None:
                return None
            layout = read_layout(self.conn, schema)
            if layout is not None:
                nodes = Colocation()
                nodes.refresh(self.conn, layout, self.tables.q("saga_instance"))
                spread = Counter(str(nodes(("", b))) for b in range(layout.count))
                return (
                    f"schema {schema!r} is distributed by bucket on Citus {version}: "
                    f"{layout.count} buckets ({layout.partitioner}) over "
                    + ", ".join(f"{node} ({n})" for node, n in sorted(spread.items()))
                )
            if not distributed(self.conn, schema):
                return (
                    f"schema {schema!r} holds plain tables on a Citus {version} coordinator: "
                    "every batch runs there; SAGA_DATABASE__DISTRIBUTED=citus moves them to a "
                    "worker (docs/scaling.md)"
                )
            where = placement(self.conn, schema)
            pinned = pinned_node(self.conn, schema)
        node = f"{where[0]}:{where[1]}" if where else "no worker yet (no table)"
        through = (
            f"its processes connect through {pinned.node}"
            + (" (the coordinator)" if pinned.group_id == 0 else "")
            if pinned
            else "no process has connected yet"
        )
        return f"schema {schema!r} is a Citus {version} distributed schema on {node}; {through}"

    def node_problem(self) -> str | None:
        """Why these settings would start a replica that is refused, or None.

        On Citus, the connection may reach another node than the one the schema's processes
        use (:func:`processor._postgres.schema.citus.pin_node`).
        """
        with self.conn.transaction():
            here = local_node(self.conn)
            pinned = pinned_node(self.conn, self.tables.schema) if here else None
        if here is None or pinned is None or pinned.group_id == here[0]:
            return None
        return (
            f"the database URL reaches Citus node {here[1]}, but the processes of schema "
            f"{self.tables.schema!r} connect through {pinned.node}: a replica started with these "
            "settings would be refused (docs/scaling.md, 'Through a worker')"
        )
