"""The participant kit's store over PostgreSQL: inbox, outbox and positions in one transaction.

The store owns one connection (a :class:`processor._postgres.held.HeldConnection`), opened on
first use and again after it broke. Every driver
error leaving :meth:`PostgresParticipantStore.transaction` (or a handler's statement) is
translated into the runtime failures of :mod:`processor._errors`.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from pydantic_core import to_json

from processor._engine.buckets import Buckets
from processor._engine.records import OutboxRow
from processor._errors import Retryable
from processor._ports.participant import Claim, InboxEntry, Rows
from processor._postgres.errors import translate
from processor._postgres.held import Conn, HeldConnection
from processor._postgres.schema.buckets import layout_mark
from processor._postgres.schema.tables import Tables
from processor._wire import outbox_channel

__all__ = ["PostgresParticipantStore", "PostgresParticipantTx", "PostgresSql"]

log = logging.getLogger(__name__)

TP = tuple[str, int]


class PostgresSql:
    """:class:`processor._ports.participant.Sql` over a psycopg connection."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    def execute(self, query: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Rows:
        try:
            return self._conn.execute(query, params)
        except psycopg.Error as e:
            raise translate(e) from e


def _dumps(obj: Any) -> bytes:
    # The kit's own JSON (headers, replies: strings, numbers, nulls): pydantic-core's encoder,
    # several times faster than json.dumps on the batch's path.
    return to_json(obj)


def _to_json(row: OutboxRow) -> dict[str, Any]:
    return {
        "saga_type": row.saga_type,
        "saga_id": row.saga_id,
        "topic": row.topic,
        "key": base64.b64encode(row.key).decode() if row.key is not None else None,
        "headers": dict(row.headers),
        "value": base64.b64encode(row.value).decode(),
        # A reply sent again on a redelivered command goes where the first one went.
        "partition": row.partition,
    }


def _from_json(d: Mapping[str, Any]) -> OutboxRow:
    key = d.get("key")
    return OutboxRow(
        saga_type=d.get("saga_type"),
        saga_id=d.get("saga_id"),
        topic=str(d["topic"]),
        key=base64.b64decode(key) if key is not None else None,
        headers=dict(d["headers"]),
        value=base64.b64decode(d["value"]),
        partition=d.get("partition"),
    )


class PostgresParticipantTx:
    """:class:`processor._ports.participant.ParticipantTx` in an open transaction.

    The inbox rows are inserted as commands are claimed (a batch's at once, :meth:`claim_all`);
    their outcomes, the outbox rows and the positions are kept until :meth:`flush`, which the
    store calls once before the commit: a transaction of many commands costs one statement for
    its outcomes, one for its replies and one per partition for its positions, not one of each
    per command. A claim of a command finished earlier in the transaction is answered from what
    is kept; nothing else reads these rows inside the transaction, so the order of the writes
    within it changes nothing that commits.

    With the tables distributed by bucket (``buckets``), every row carries its bucket: a
    command's inbox row its key's (:class:`processor._ports.participant.Claim`), a reply its
    own key's (the command's by default), a position its partition's; a statement that names
    rows by id names one bucket, so Citus routes it to one worker.
    """

    def __init__(self, conn: Conn, tables: Tables, buckets: Buckets | None = None) -> None:
        self._conn = conn
        self._tables = tables
        self._buckets = buckets
        self._inbox = f'"{tables.schema}".inbox'
        self.sql = PostgresSql(conn)
        self.queued = 0
        self._rows: list[OutboxRow] = []
        self._positions: dict[tuple[str, str, int], int] = {}
        self._finished: dict[str, InboxEntry] = {}
        # Each claimed command's bucket (tables by bucket).
        self._bucket_of: dict[str, int] = {}

    def _claim_bucket(self, message_id: str, key: bytes | None) -> int:
        if self._buckets is None:
            return 0
        bucket = self._buckets.of_key(key if key is not None else message_id.encode())
        self._bucket_of[message_id] = bucket
        return bucket

    def _row_bucket(self, row: OutboxRow) -> int:
        assert self._buckets is not None
        if row.key is not None:
            return self._buckets.of_key(row.key)
        if row.saga_id is not None:
            return self._buckets.of(row.saga_id)
        return self._buckets.key(0)

    def bucket_of(self, message_id: str) -> int:
        return self._bucket_of.get(message_id, 0)

    def claim(
        self,
        message_id: str,
        message_type: str,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None = None,
    ) -> InboxEntry | None:
        by = self._buckets is not None
        bucket = self._claim_bucket(message_id, key)
        inserted = self._conn.execute(
            f"INSERT INTO {self._inbox} (message_id, message_type, outcome, topic, partition, "
            + ('"offset", bucket) VALUES (%s, %s, %s, %s, %s, %s, %s)' if by else
               '"offset") VALUES (%s, %s, %s, %s, %s, %s)')
            + " ON CONFLICT DO NOTHING RETURNING 1",
            (message_id, message_type, "pending", topic, partition, offset)
            + ((bucket,) if by else ()),
        ).fetchone()  # fmt: skip
        if inserted is not None:
            return None
        finished = self._finished.get(message_id)
        if finished is not None:
            return finished
        row = self._conn.execute(
            f"SELECT outcome, replies FROM {self._inbox} WHERE "
            + ("bucket = %s::int AND message_id = %s" if by else "message_id = %s"),
            ((bucket, message_id) if by else (message_id,)),
        ).fetchone()
        # The conflicting row is visible: its inserter committed before our insert returned.
        assert row is not None
        return InboxEntry(message_id, str(row[0]), tuple(_from_json(r) for r in row[1]))

    def claim_all(self, claims: Sequence[Claim]) -> dict[str, InboxEntry | None]:
        if not claims:
            return {}
        # In message id order: two transactions claiming overlapping batches wait for each
        # other's rows in the same order, never in a cycle.
        ordered = sorted(claims, key=lambda c: c.message_id)
        buckets = [self._claim_bucket(c.message_id, c.key) for c in ordered]
        by = self._buckets is not None
        fresh = {
            str(r[0])
            for r in self._conn.execute(
                f"INSERT INTO {self._inbox} (message_id, message_type, outcome, topic, "
                + ('partition, "offset", bucket) SELECT m, t, %s::text, tp, p, o, b FROM unnest('
                   "%b::text[], %b::text[], %b::text[], %b::int[], %b::bigint[], %b::int[])"
                   " AS u(m, t, tp, p, o, b)" if by else
                   'partition, "offset") SELECT m, t, %s::text, tp, p, o FROM unnest('
                   "%b::text[], %b::text[], %b::text[], %b::int[], %b::bigint[])"
                   " AS u(m, t, tp, p, o)")
                + " ORDER BY m ON CONFLICT DO NOTHING RETURNING message_id",
                (
                    "pending",
                    [c.message_id for c in ordered],
                    [c.message_type for c in ordered],
                    [c.topic for c in ordered],
                    [c.partition for c in ordered],
                    [c.offset for c in ordered],
                )
                + ((buckets,) if by else ()),
            ).fetchall()
        }  # fmt: skip
        found: dict[str, InboxEntry | None] = dict.fromkeys(fresh)
        seen: dict[int, list[str]] = {}
        for c in claims:
            if c.message_id not in fresh:
                seen.setdefault(self._bucket_of.get(c.message_id, 0), []).append(c.message_id)
        # The conflicting rows are visible: their inserters committed before the insert
        # returned. By bucket, each lookup is one worker's.
        for bucket, ids in sorted(seen.items()):
            rows = self._conn.execute(
                f"SELECT message_id, outcome, replies FROM {self._inbox} WHERE "
                + ("bucket = %s::int AND message_id = ANY(%b::text[])" if by else
                   "message_id = ANY(%b::text[])"),
                ((bucket, ids) if by else (ids,)),
            ).fetchall()  # fmt: skip
            for mid, outcome, replies in rows:
                found[str(mid)] = InboxEntry(
                    str(mid), str(outcome), tuple(_from_json(r) for r in replies)
                )
        return {c.message_id: found[c.message_id] for c in claims}

    def finish(self, message_id: str, outcome: str, replies: Sequence[OutboxRow]) -> None:
        # Written by flush, with the batch's others in one statement; a claim of the same id
        # later in this transaction is answered from here.
        self._finished[message_id] = InboxEntry(message_id, outcome, tuple(replies))
        self.publish(replies)

    def publish(self, rows: Sequence[OutboxRow]) -> None:
        self._rows.extend(rows)
        self.queued += len(rows)

    def advance(self, group_id: str, topic: str, partition: int, next_offset: int) -> None:
        key = (group_id, topic, partition)
        self._positions[key] = max(next_offset, self._positions.get(key, next_offset))

    def flush(self) -> None:
        """Writes the kept outcomes, replies (in the order queued) and positions."""
        if self._finished:
            by_bucket: dict[int, list[InboxEntry]] = {}
            for entry in self._finished.values():
                by_bucket.setdefault(self._bucket_of.get(entry.message_id, 0), []).append(entry)
            for bucket, done in sorted(by_bucket.items()):
                self._finish_rows(bucket, done)
            self._finished = {}
        if self._rows:
            self._insert_rows(self._rows)
            self._rows = []
        for (group_id, topic, partition), next_offset in sorted(self._positions.items()):
            if self._buckets is None:
                self._conn.execute(
                    self._tables.render(_ADVANCE), (group_id, topic, partition, next_offset)
                )
            else:
                self._conn.execute(
                    self._tables.render(_ADVANCE_B),
                    (self._buckets.of_partition(partition), group_id, topic, partition,
                     next_offset),
                )  # fmt: skip
        self._positions = {}

    def _finish_rows(self, bucket: int, done: list[InboxEntry]) -> None:
        by = self._buckets is not None
        self._conn.execute(
            f"UPDATE {self._inbox} AS i SET outcome = u.o, replies = u.r"
            " FROM unnest(%b::text[], %b::text[], %b::jsonb[]) AS u(m, o, r)"
            + (" WHERE i.bucket = %s::int AND i.message_id = u.m" if by else
               " WHERE i.message_id = u.m"),
            (
                [e.message_id for e in done],
                [e.outcome for e in done],
                [Jsonb([_to_json(r) for r in e.replies], _dumps) for e in done],
            )
            + ((bucket,) if by else ()),
        )  # fmt: skip

    def _insert_rows(self, rows: list[OutboxRow]) -> None:
        # One statement, the rows' ids given in the order queued (the relay's order). Binary
        # arrays: in text form psycopg quotes every element with regular expressions.
        by = self._buckets is not None
        self._conn.execute(
            self._tables.render(_INSERT_OUTBOX_B if by else _INSERT_OUTBOX),
            (
                [r.saga_type for r in rows],
                [r.saga_id for r in rows],
                [r.topic for r in rows],
                [r.partition for r in rows],
                [r.key for r in rows],
                [Jsonb(dict(r.headers), _dumps) for r in rows],
                [r.value for r in rows],
            )
            + (([self._row_bucket(r) for r in rows],) if by else ()),
        )


_INSERT_OUTBOX = (
    "INSERT INTO {outbox} (saga_type, saga_id, topic, partition, key, headers, value) "
    "SELECT st, si, t, p, k, h, v FROM unnest(%b::text[], %b::text[], %b::text[], %b::int[], "
    "%b::bytea[], %b::jsonb[], %b::bytea[]) WITH ORDINALITY AS u(st, si, t, p, k, h, v, n) "
    "ORDER BY n"
)
_INSERT_OUTBOX_B = (
    "INSERT INTO {outbox} (saga_type, saga_id, topic, partition, key, headers, value, bucket) "
    "SELECT st, si, t, p, k, h, v, b FROM unnest(%b::text[], %b::text[], %b::text[], %b::int[], "
    "%b::bytea[], %b::jsonb[], %b::bytea[], %b::int[]) "
    "WITH ORDINALITY AS u(st, si, t, p, k, h, v, b, n) ORDER BY n"
)
_ADVANCE = (
    "INSERT INTO {offsets} AS o (group_id, topic, partition, next_offset, updated_at) "
    "VALUES (%s, %s, %s, %s, now()) ON CONFLICT (group_id, topic, partition) DO UPDATE "
    "SET next_offset = greatest(o.next_offset, excluded.next_offset), "
    "updated_at = excluded.updated_at"
)
_ADVANCE_B = (
    "INSERT INTO {offsets} AS o (bucket, group_id, topic, partition, next_offset, updated_at) "
    "VALUES (%s, %s, %s, %s, %s, now()) ON CONFLICT (bucket, group_id, topic, partition) "
    "DO UPDATE SET next_offset = greatest(o.next_offset, excluded.next_offset), "
    "updated_at = excluded.updated_at"
)


class PostgresParticipantStore:
    """:class:`processor._ports.participant.ParticipantStore` over one PostgreSQL connection.

    A transaction may hold one command or a consumer batch of them (see
    :meth:`processor._authoring.participant.kit.CommandKit.handle_together`).

    Args:
        connect: Opens a new connection (not in autocommit mode).
        tables: The participant's schema.
    """

    def __init__(self, connect: Callable[[], Conn], tables: Tables) -> None:
        self._held = HeldConnection(connect, layout=layout_mark(tables.schema))
        self._tables = tables
        self._channel = outbox_channel(tables.schema)

    def positions(self, group_id: str, partitions: Sequence[TP]) -> Mapping[TP, int | None]:
        with self._held.session() as conn, conn.transaction():
            rows = conn.execute(
                self._tables.render(
                    "SELECT topic, partition, next_offset FROM {offsets} WHERE group_id = %s"
                ),
                (group_id,),
            ).fetchall()
        stored = {(str(t), int(p)): (int(o) if o is not None else None) for t, p, o in rows}
        return {tp: stored.get(tp) for tp in partitions}

    @contextmanager
    def transaction(self) -> Iterator[PostgresParticipantTx]:
        try:
            with self._held.session() as conn, conn.transaction():
                tx = PostgresParticipantTx(
                    conn, self._tables, self._held.buckets(conn, self._tables.schema)
                )
                yield tx
                tx.flush()
                if tx.queued:
                    # Wakes relays of other replicas; this process wakes its own directly.
                    conn.execute("SELECT pg_notify(%s, '')", (self._channel,))
        except Retryable:
            # A handler's statement met a lost connection (already translated).
            if self._held.lost:
                self._held.close()
            raise

    @property
    def reconnects(self) -> int:
        """Connections opened after the first one (each replaced a broken one)."""
        return max(0, self._held.opened - 1)

    def close(self) -> None:
        self._held.close()
