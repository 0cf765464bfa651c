"""Reads and writes one batch in one transaction: sagas, history, outbox, deadlines, offsets.

Every multi-row write is one set-based statement, so a batch costs a fixed number of round trips
however many records it holds. The hot statements (the load's keys; saga, history, outbox and
deadline rows) take the batch's rows as one JSON array of arrays, encoded by one typed
pydantic-core call and read with `jsonb_array_elements`; bytes go beside as binary arrays
(`%b`), zipped in order by `ROWS FROM`. An array parameter per column cost a Python step per
value to build and another in psycopg to dump. The rarer statements (offsets, dead letters,
parked records, operator changes) keep binary arrays over `unnest`: in text form psycopg would
quote and escape every element with regular expressions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from operator import attrgetter
from typing import Any

import psycopg
from psycopg.rows import TupleRow
from pydantic import TypeAdapter
from pydantic_core import to_json

from processor.engine.records import OffsetCommit, Record
from processor.engine.rows import (
    DeadlineRef,
    HeldMessage,
    Loaded,
    SagaKey,
    SagaRow,
    SagaStatus,
    Wants,
    WriteSet,
)
from processor.errors import ConcurrentUpdate, FencedOut
from processor.postgres.deadlines import LEASE_NAME
from processor.postgres.schema import Tables
from processor.wire import deadline_channel, outbox_channel

Conn = psycopg.Connection[TupleRow]

# How long an ownership claim waits for the partitions' rows (the old owner's batch or relay).
CLAIM_LOCK_TIMEOUT_MS = 5000


def _rows(n: int) -> str:
    return ", ".join(["%s"] * n)


# Rows as the JSON arrays the inserts and updates read (`x->>0`, ...): the fields in that
# order, JSON values (a saga's state, headers, effects) nested as they are. One pydantic-core call
# encodes a batch's rows; an array parameter per column cost a Python step per value to build
# and another to dump. Bytes are not JSON: they go beside, as binary arrays.
_history_fields = attrgetter(
    "saga_type",
    "saga_id",
    "message_id",
    "message_type",
    "kind",
    "outcome",
    "version",
    "topic",
    "partition",
    "offset",
    "detail",
    "headers",
    "effects",
)
_new_saga_fields = attrgetter(
    "saga_type",
    "saga_id",
    "state",
    "status",
    "version",
    "parked_reason",
    "machine_state",
    "state_version",
)
_old_saga_fields = attrgetter(
    "saga_type",
    "saga_id",
    "state",
    "status",
    "version",
    "parked_reason",
    "expected_version",
    "machine_state",
    "state_version",
)
_outbox_fields = attrgetter("saga_type", "saga_id", "topic", "partition", "headers", "source")
_deadline_fields = attrgetter(
    "id",
    "saga_type",
    "saga_id",
    "name",
    "due_at",
    "payload",
    "topic",
    "partition",
    "traceparent",
    "tracestate",
)


class BatchStore:
    """SQL for the consumer's side of the engine, on one connection the caller owns."""

    def __init__(self, conn: Conn, tables: Tables, group_id: str) -> None:
        self.conn = conn
        self.group_id = group_id
        r = tables.render
        self.channel = outbox_channel(tables.schema)
        self.deadline_channel = deadline_channel(tables.schema)
        # FOR UPDATE, not the FOR NO KEY UPDATE the upsert takes: it waits for a relay claim
        # in flight on these partitions (FOR KEY SHARE at the old epoch) to end, so the old
        # owner's relay has published and committed (or rolled back) before the epoch moves.
        # The owner's own offset updates (FOR NO KEY UPDATE) do not wait for the relay.
        self._lock_owned = r(
            """
            SELECT 1 FROM {offsets}
             WHERE group_id = %s AND (topic, partition) IN
                   (SELECT * FROM unnest(%b::text[], %b::int[]))
             ORDER BY topic, partition
               FOR UPDATE
            """
        )
        self._claim = r(
            """
            INSERT INTO {offsets} AS o (group_id, topic, partition, next_offset, owner_epoch, owner)
            SELECT %s, t, p, NULL, 1, %s FROM unnest(%b::text[], %b::int[]) AS u(t, p)
            ON CONFLICT (group_id, topic, partition) DO UPDATE
               SET owner_epoch = o.owner_epoch + 1, owner = excluded.owner, updated_at = now()
            RETURNING topic, partition, owner_epoch, next_offset
            """
        )
        self._read_offsets = r(
            """
            SELECT topic, partition, owner_epoch, next_offset FROM {offsets}
             WHERE group_id = %s AND (topic, partition) IN
                   (SELECT * FROM unnest(%b::text[], %b::int[]))
            """
        )
        # The batch's keys go as one JSON array of [type, id(, message id)] arrays: encoding
        # them is one call into pydantic-core, where an array parameter per key part costs a
        # Python step per value to build and another to dump.
        # Each key is one index probe: a LATERAL subquery with LIMIT 1 (a key has at most one
        # row) cannot be turned into a join. As a join (``IN (SELECT ...)``), a table whose
        # statistics still say "small" (a young or fast-growing one) was planned as a hash of
        # every applied history row: each batch then read the whole history (seen at 20,000
        # rows: 8.8 ms of a 9 ms load, growing with the table).
        self._load_sagas = r(
            """
            SELECT s.* FROM jsonb_array_elements(%s::jsonb) AS k CROSS JOIN LATERAL (
                SELECT saga_type, saga_id, state, status, version, parked_reason, state_version
                  FROM {instance}
                 WHERE saga_type = k->>0 AND saga_id = k->>1 LIMIT 1) AS s
            """
        )
        self._load_tombstones = r(
            """
            SELECT t.* FROM jsonb_array_elements(%s::jsonb) AS k CROSS JOIN LATERAL (
                SELECT saga_type, saga_id FROM {tombstone}
                 WHERE saga_type = k->>0 AND saga_id = k->>1 LIMIT 1) AS t
            """
        )
        self._load_applied = r(
            """
            SELECT h.* FROM jsonb_array_elements(%s::jsonb) AS k CROSS JOIN LATERAL (
                SELECT saga_type, saga_id, message_id FROM {history}
                 WHERE outcome = 'applied' AND saga_type = k->>0 AND saga_id = k->>1
                   AND message_id = k->>2 LIMIT 1) AS h
            """
        )
        self._load_deadlines = r(
            """
            SELECT id::text, saga_type, saga_id, name, due_at, payload, dispatch_token
              FROM {deadline} WHERE id = ANY(%b::uuid[])
            """
        )
        self._load_lease = r("SELECT token FROM {deadline_lock} WHERE name = %s")
        self._insert_sagas = r(
            """
            INSERT INTO {instance} (saga_type, saga_id, state, status, version, parked_reason,
                                    ended_at, machine_state, machine_state_since, state_version)
            SELECT t, i, s, st, v, pr, CASE WHEN st = 'ended' THEN now() END, ms,
                   CASE WHEN ms IS NOT NULL THEN now() END, sv
              FROM (SELECT x->>0, x->>1, nullif(x->2, 'null'), x->>3, (x->>4)::bigint, x->>5,
                           x->>6, (x->>7)::int
                      FROM jsonb_array_elements(%s::jsonb) AS x) AS u(t, i, s, st, v, pr, ms, sv)
            """
        )
        self._update_sagas = r(
            """
            UPDATE {instance} AS x
               SET state = u.s, status = u.st, version = u.v, parked_reason = u.pr,
                   updated_at = now(),
                   ended_at = CASE WHEN u.st = 'ended' THEN coalesce(x.ended_at, now()) END,
                   machine_state = u.ms,
                   machine_state_since = CASE WHEN u.ms IS DISTINCT FROM x.machine_state
                                              THEN now() ELSE x.machine_state_since END,
                   state_version = u.sv
              FROM (SELECT x->>0, x->>1, nullif(x->2, 'null'), x->>3, (x->>4)::bigint, x->>5,
                           (x->>6)::bigint, x->>7, (x->>8)::int
                      FROM jsonb_array_elements(%s::jsonb) AS x)
                   AS u(t, i, s, st, v, pr, expected, ms, sv)
             WHERE x.saga_type = u.t AND x.saga_id = u.i AND x.version = u.expected
            """
        )
        # Everything but the bytes as one JSON array per row; the record's bytes as binary
        # arrays beside it, zipped in order by ROWS FROM (ids are assigned in planning order).
        self._insert_history = r(
            """
            INSERT INTO {history} (saga_type, saga_id, message_id, message_type, kind, outcome,
                                   version, topic, partition, "offset", detail, headers,
                                   payload, payload_sha256, effects)
            SELECT x->>0, x->>1, x->>2, x->>3, x->>4, x->>5, (x->>6)::bigint, x->>7,
                   (x->>8)::int, (x->>9)::bigint, x->>10, nullif(x->11, 'null'), p, sha,
                   nullif(x->12, 'null')
              FROM ROWS FROM (jsonb_array_elements(%s::jsonb), unnest(%b::bytea[]),
                              unnest(%b::bytea[])) AS u(x, p, sha)
            """
        )
        self._insert_outbox = r(
            """
            INSERT INTO {outbox} (saga_type, saga_id, topic, partition, key, headers, value,
                                  source_topic, source_partition)
            SELECT x->>0, x->>1, x->>2, (x->>3)::int, k, x->4, v, x->5->>0, (x->5->>1)::int
              FROM ROWS FROM (jsonb_array_elements(%s::jsonb), unnest(%b::bytea[]),
                              unnest(%b::bytea[])) AS u(x, k, v)
            """
        )
        self._clear_deadlines = r(
            """
            DELETE FROM {deadline} AS d
             USING (SELECT k->>0, k->>1 FROM jsonb_array_elements(%s::jsonb) AS k) AS u(t, i)
             WHERE d.saga_type = u.t AND d.saga_id = u.i
            """
        )
        self._delete_deadlines = r(
            """
            DELETE FROM {deadline} AS d
             USING (SELECT k->>0, k->>1, k->>2 FROM jsonb_array_elements(%s::jsonb) AS k)
                   AS u(t, i, n)
             WHERE d.saga_type = u.t AND d.saga_id = u.i AND d.name = u.n
            """
        )
        self._insert_deadlines = r(
            """
            INSERT INTO {deadline} (id, saga_type, saga_id, name, due_at, payload, topic, partition,
                                    traceparent, tracestate)
            SELECT (x->>0)::uuid, x->>1, x->>2, x->>3, (x->>4)::timestamptz, nullif(x->5, 'null'),
                   x->>6, (x->>7)::int, x->>8, x->>9
              FROM jsonb_array_elements(%s::jsonb) AS x
            """
        )
        self._insert_dead_letters = r(
            """
            INSERT INTO {dead_letter} (topic, partition, "offset", key, value, headers, reason,
                                       detail)
            SELECT * FROM unnest(%b::text[], %b::int[], %b::bigint[], %b::bytea[], %b::bytea[],
                                 %b::jsonb[], %b::text[], %b::text[])
            """
        )
        self._reset_deadlines = r(
            """
            UPDATE {deadline} AS d SET dispatched_at = NULL
              FROM unnest(%b::uuid[], %b::bigint[]) AS u(i, t)
             WHERE d.id = u.i AND d.dispatch_token = u.t
            """
        )
        # An operator's retry replays the records held behind the saga, with the deadline rows
        # its held fired deadlines name.
        self._load_held = r(
            """
            SELECT saga_type, saga_id, id, topic, partition, "offset", key, value, headers
              FROM {parked}
             WHERE (saga_type, saga_id) IN (SELECT * FROM unnest(%b::text[], %b::text[]))
             ORDER BY id
            """
        )
        self._load_saga_deadlines = r(
            """
            SELECT id::text, saga_type, saga_id, name, due_at, payload, dispatch_token
              FROM {deadline}
             WHERE (saga_type, saga_id) IN (SELECT * FROM unnest(%b::text[], %b::text[]))
            """
        )
        self._release_held = r("DELETE FROM {parked} WHERE id = ANY(%s::bigint[])")
        # An operator's fire-now: due at once and undispatched, so the leader fires it next.
        self._fire_now = r(
            """
            UPDATE {deadline} AS d SET due_at = now(), dispatched_at = NULL, dispatch_token = NULL
              FROM unnest(%b::text[], %b::text[], %b::text[]) AS u(t, i, n)
             WHERE d.saga_type = u.t AND d.saga_id = u.i AND d.name = u.n
            """
        )
        self._insert_parked = r(
            """
            INSERT INTO {parked} (saga_type, saga_id, topic, partition, "offset", key, value,
                                  headers, reason)
            SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::int[], %b::bigint[],
                                 %b::bytea[], %b::bytea[], %b::jsonb[], %b::text[])
            """
        )
        self._commit_offsets = r(
            """
            UPDATE {offsets} AS o SET next_offset = u.n, updated_at = now()
              FROM unnest(%b::text[], %b::int[], %b::bigint[], %b::bigint[], %b::bigint[])
                   AS u(t, p, n, expected, epoch)
             WHERE o.group_id = %s AND o.topic = u.t AND o.partition = u.p
               AND o.owner_epoch = u.epoch AND o.next_offset IS NOT DISTINCT FROM u.expected
            RETURNING o.topic, o.partition
            """
        )

    # -- partitions --------------------------------------------------------------------------

    def claim(
        self, partitions: Sequence[tuple[str, int]], owner: str
    ) -> dict[tuple[str, int], tuple[int, int | None]]:
        """Takes ownership: bumps each partition's epoch, so older owners' commits fail."""
        topics, numbers = [t for t, _ in partitions], [p for _, p in partitions]
        with self.conn.transaction():
            # Bounded: a claim the old owner's relay holds up (a slow flush) fails as retryable
            # (55P03), and the worker keeps the partitions paused and tries again.
            self.conn.execute(f"SET LOCAL lock_timeout = '{CLAIM_LOCK_TIMEOUT_MS}ms'")
            self.conn.execute(self._lock_owned, (self.group_id, topics, numbers))
            rows = self.conn.execute(
                self._claim, (self.group_id, owner, topics, numbers)
            ).fetchall()
        return {(t, p): (epoch, nxt) for t, p, epoch, nxt in rows}

    def read_offsets(
        self, partitions: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[int, int | None]]:
        with self.conn.transaction():
            rows = self.conn.execute(
                self._read_offsets,
                (self.group_id, [t for t, _ in partitions], [p for _, p in partitions]),
            ).fetchall()
        return {(t, p): (epoch, nxt) for t, p, epoch, nxt in rows}

    # -- one batch -------------------------------------------------------------------------

    def load(self, wants: Wants) -> Loaded:
        """Reads every row the planner needs in one pipelined round trip."""
        keys = sorted(wants.saga_keys)
        mkeys = sorted(wants.message_keys)
        ids = sorted(wants.deadline_ids)
        with self.conn.pipeline():
            c0 = self.conn.execute("SELECT now()")
            saga_keys = (_encode_keys(keys),)
            c1 = self.conn.execute(self._load_sagas, saga_keys)
            # After the sagas, never before: each statement reads its own snapshot, and retention
            # deletes an instance and writes its tombstone in one transaction, so a saga purged
            # between the two reads is seen in both, never in neither.
            c5 = self.conn.execute(self._load_tombstones, saga_keys)
            c2 = (
                self.conn.execute(self._load_applied, (_encode_message_keys(mkeys),))
                if mkeys
                else None
            )
            c3 = self.conn.execute(self._load_deadlines, (ids,)) if ids else None
            hk = sorted(wants.held_keys)
            hargs = ([k[0] for k in hk], [k[1] for k in hk])
            c4 = self.conn.execute(self._load_lease, (LEASE_NAME,)) if ids or hk else None
            c6 = self.conn.execute(self._load_held, hargs) if hk else None
            c7 = self.conn.execute(self._load_saga_deadlines, hargs) if hk else None
        sagas = {
            (t, i): SagaRow(t, i, state, SagaStatus(status), version, reason, sv)
            for t, i, state, status, version, reason, sv in c1.fetchall()
        }
        applied = {(t, i, m) for t, i, m in c2.fetchall()} if c2 else set()
        deadlines = (
            {
                did: DeadlineRef(t, i, n, due, payload, token)
                for did, t, i, n, due, payload, token in c3.fetchall()
            }
            if c3
            else {}
        )
        lease = c4.fetchone() if c4 else None
        now_row = c0.fetchone()
        assert now_row is not None
        tombstones = {(t, i) for t, i in c5.fetchall()}
        held: dict[SagaKey, list[HeldMessage]] = {}
        if c6 is not None and c7 is not None:
            for t, i, *rest in c6.fetchall():
                held.setdefault((t, i), []).append(held_message(rest))
            deadlines.update(
                (did, DeadlineRef(t, i, n, due, payload, token))
                for did, t, i, n, due, payload, token in c7.fetchall()
            )
        return Loaded(
            sagas,
            applied,
            deadlines,
            int(lease[0]) if lease else None,
            now_row[0],
            tombstones=tombstones,
            held=held,
        )

    def write(self, ws: WriteSet, offsets: Sequence[OffsetCommit]) -> None:
        """Writes the batch; raises FencedOut or ConcurrentUpdate (the caller rolls back)."""
        conn = self.conn
        new = [s for s in ws.sagas if s.expected_version is None]
        old = [s for s in ws.sagas if s.expected_version is not None]
        # Plain statements, not a pipeline: psycopg ends a pipeline with a flush request, which
        # leaves the server's idle-in-transaction timer disarmed until the next ordinary
        # statement. A replica frozen anywhere in here (SIGSTOP, a stalled VM) would then hold
        # these row locks, and block the partitions' next owner, until it woke up. The extra
        # round trips cost little: this runs on the writer thread, beside the next batch's work.
        # Fencing first: the offsets' compare-and-set also locks those rows against a claim, and
        # a batch whose partitions were taken over stops here, before it writes a saga row (a
        # stale batch would otherwise fail on a saga's key and look like a data error).
        if offsets:
            committed = conn.execute(
                self._commit_offsets,
                (
                    [o.topic for o in offsets],
                    [o.partition for o in offsets],
                    [o.next_offset for o in offsets],
                    [o.expected for o in offsets],
                    [o.epoch for o in offsets],
                    self.group_id,
                ),
            )
            done = {(t, p) for t, p in committed.fetchall()}
            lost = {(o.topic, o.partition) for o in offsets} - done
            if lost:
                raise FencedOut(lost)
        if new:
            conn.execute(self._insert_sagas, (_encode_new_sagas(map(_new_saga_fields, new)),))
        if old:
            updated = conn.execute(
                self._update_sagas, (_encode_old_sagas(map(_old_saga_fields, old)),)
            )
            if updated.rowcount != len(old):
                raise ConcurrentUpdate(
                    f"{len(old) - updated.rowcount} saga rows changed under the batch"
                )
        if ws.history:
            h = ws.history
            conn.execute(
                self._insert_history,
                (
                    _encode_history(map(_history_fields, h)),
                    [x.payload for x in h],
                    [x.payload_sha256 for x in h],
                ),
            )
        if ws.outbox:
            self.insert_outbox(ws.outbox)
        if ws.deadline_clears:
            conn.execute(self._clear_deadlines, (_encode_keys(ws.deadline_clears),))
        if ws.deadline_deletes:
            conn.execute(self._delete_deadlines, (_encode_message_keys(ws.deadline_deletes),))
        if ws.deadline_inserts:
            rows = _encode_deadlines(map(_deadline_fields, ws.deadline_inserts))
            conn.execute(self._insert_deadlines, (rows,))
        if ws.deadline_resets:
            rs = ws.deadline_resets
            conn.execute(self._reset_deadlines, ([x[0] for x in rs], [x[1] for x in rs]))
        if ws.deadline_fire_now:
            f = ws.deadline_fire_now
            conn.execute(self._fire_now, ([x[0] for x in f], [x[1] for x in f], [x[2] for x in f]))
        if ws.dead_letters:
            dl = ws.dead_letters
            conn.execute(
                self._insert_dead_letters,
                (
                    [x.record.topic for x in dl],
                    [x.record.partition for x in dl],
                    [x.record.offset for x in dl],
                    [x.record.key for x in dl],
                    [x.record.value for x in dl],
                    [_json(x.record.headers_text()) for x in dl],
                    [x.reason for x in dl],
                    [x.detail for x in dl],
                ),
            )
        if ws.held_releases:
            conn.execute(self._release_held, (ws.held_releases,))
        if ws.parked:
            self.insert_parked(ws.parked)
        # At most one notification per channel and batch, both in one statement (Postgres also
        # folds repeats within a transaction): the outbox's wakes every replica's relay; the
        # deadlines' wakes the deadline poller (in any replica) in case this one is due sooner.
        wake_relay = bool(ws.outbox)
        wake_poller = bool(ws.deadline_inserts or ws.deadline_resets or ws.wake_deadlines)
        if wake_relay and wake_poller:
            conn.execute(
                "SELECT pg_notify(%s, ''), pg_notify(%s, '')", (self.channel, self.deadline_channel)
            )
        elif wake_relay or wake_poller:
            channel = self.channel if wake_relay else self.deadline_channel
            conn.execute("SELECT pg_notify(%s, '')", (channel,))

    def insert_outbox(self, rows: Sequence[Any]) -> None:
        fields = _encode_outbox(map(_outbox_fields, rows))
        self.conn.execute(
            self._insert_outbox, (fields, [r.key for r in rows], [r.value for r in rows])
        )

    def insert_parked(self, rows: Sequence[Any]) -> None:
        self.conn.execute(
            self._insert_parked,
            (
                [x.saga_type for x in rows],
                [x.saga_id for x in rows],
                [x.record.topic for x in rows],
                [x.record.partition for x in rows],
                [x.record.offset for x in rows],
                [x.record.key for x in rows],
                [x.record.value or b"" for x in rows],
                [_json(x.record.headers_text()) for x in rows],
                [x.reason for x in rows],
            ),
        )


def _json(value: Any) -> str | None:
    # pydantic-core's encoder: several times faster than json.dumps on the per-row hot path.
    return None if value is None else to_json(value).decode()


class _Rows:
    """Encodes rows of known field types as one JSON array of arrays.

    The same bytes as ``to_json`` of the tuples, several times faster: a serializer that knows
    each field's type skips inferring it value by value (and a ``StrEnum`` field, declared str,
    skips the enum's slow ``value`` property). JSON values (state, headers, effects, payloads)
    are ``Any``: encoded as ``to_json`` would. A value of another type than declared is still
    encoded, by inference, with a warning.
    """

    def __init__(self, *fields: Any) -> None:
        self._adapter: TypeAdapter[Any] = TypeAdapter(list[tuple[fields]])  # type: ignore[valid-type]

    def __call__(self, rows: Iterable[Sequence[Any]]) -> str:
        rows = rows if isinstance(rows, list) else list(rows)
        return self._adapter.dump_json(rows, fallback=_plain_mapping).decode()


_Text = str | None
_encode_keys = _Rows(str, str)
_encode_message_keys = _Rows(str, str, str)
_encode_history = _Rows(str, str, str, str, str, str, int | None, str, int, int, _Text, Any, Any)
_encode_new_sagas = _Rows(str, str, Any, str, int, _Text, _Text, int)
_encode_old_sagas = _Rows(str, str, Any, str, int, _Text, int, _Text, int)
_encode_deadlines = _Rows(str, str, str, str, datetime, Any, str, int, _Text, _Text)
_encode_outbox = _Rows(_Text, _Text, str, int | None, Any, tuple[str, int] | None)


def _plain_mapping(value: Any) -> Any:
    # An outbox row's headers may be any Mapping; the encoder takes only dicts by itself.
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def held_message(row: Sequence[Any]) -> HeldMessage:
    """A ``parked_message`` row (id, topic, partition, offset, key, value, headers) as held."""
    parked_id, topic, partition, offset, key, value, headers = row
    pairs = headers.items() if isinstance(headers, Mapping) else json.loads(headers).items()
    return HeldMessage(
        int(parked_id),
        Record(
            topic=topic,
            partition=int(partition),
            offset=int(offset),
            key=bytes(key) if key is not None else None,
            value=bytes(value),
            headers=tuple((str(k), str(v).encode()) for k, v in pairs),
        ),
    )
