"""Reads and writes one batch in one transaction: sagas, history, outbox, deadlines, offsets.

Every multi-row write is one set-based statement, and the batch's offsets and its saga, history,
outbox and deadline rows go together in one statement of data-modifying CTEs, so a batch costs a
fixed, small number of round trips however many records it holds. The hot statements (the load's
keys; saga, history, outbox and deadline rows) take the batch's rows as one JSON array of arrays,
encoded by one typed pydantic-core call and read with `jsonb_array_elements`; bytes go beside as
binary arrays (`%b`), zipped in order by `ROWS FROM`. An array parameter per column cost a
Python step per value to build and another in psycopg to dump. The rarer statements (offsets,
dead letters, parked records, operator changes) keep binary arrays over `unnest`: in text form
psycopg would quote and escape every element with regular expressions. The statements
themselves are in `processor._postgres.batch.sql`, the rows' encoding in
`processor._postgres.batch.rows`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg

from processor._engine.buckets import Buckets
from processor._engine.records import OffsetCommit
from processor._engine.rows import (
    DeadlineRef,
    Loaded,
    SagaKey,
    SagaRow,
    SagaStatus,
    Wants,
    WriteSet,
)
from processor._errors import ConcurrentUpdate, FencedOut, LockBusy
from processor._postgres.batch import rows as batch_rows
from processor._postgres.batch import sql, sql_buckets
from processor._postgres.batch.operator_reads import OperatorReads
from processor._postgres.colocation import Colocation
from processor._postgres.deadlines import LEASE_NAME
from processor._postgres.held import Conn
from processor._postgres.reads.audit import encode_entries
from processor._postgres.schema.buckets import read_layout
from processor._postgres.schema.citus import distributed
from processor._postgres.schema.tables import Tables
from processor._postgres.stuck import end_stuck_holders
from processor._wire import deadline_channel, outbox_channel

# Conn is re-exported: the batch's callers open the connection this store runs on.
__all__ = ["CLAIM_LOCK_TIMEOUT_MS", "BatchSql", "Conn"]

# How long an ownership claim waits for the partitions' rows (the old owner's batch or relay).
CLAIM_LOCK_TIMEOUT_MS = 5000

# The sessions holding locks on the offsets table besides this one (a claim that timed out).
_HOLDERS = """
SELECT a.pid, a.application_name, a.state, a.wait_event,
       extract(epoch FROM now() - a.xact_start)::int, left(a.query, 80)
  FROM pg_stat_activity AS a
 WHERE a.pid <> pg_backend_pid()
   AND a.pid IN (SELECT pid FROM pg_locks WHERE relation = %s::regclass AND granted)
 ORDER BY a.xact_start
 LIMIT 5
"""


class BatchSql:
    """SQL for the consumer's side of the engine, on one connection the caller owns."""

    def __init__(
        self,
        conn: Conn,
        tables: Tables,
        group_id: str,
        wake_within: timedelta | None = None,
        origin: str = "",
        *,
        colocation: Colocation | None = None,
        stuck_after: timedelta | None = None,
    ) -> None:
        """Statements over ``conn``.

        Args:
            conn: The connection; the caller owns it and its transactions.
            tables: Where the processor's tables live.
            group_id: The consumer group whose offsets rows this store writes.
            wake_within: The deadline poller's polling interval: a batch wakes the poller (in
                any replica) only for new deadlines due within it. None: for any new deadline.
            origin: The payload of this store's notifications: a listener in the same process
                skips them, its loops being woken in-process already.
            colocation: Kept current with where the buckets live (tables distributed by
                bucket only), at the start and every so often before a load.
            stuck_after: A claim that waited on a replica's session stuck mid-statement for
                longer than this ends that session (:mod:`processor._postgres.stuck`); None:
                it only names it.
        """
        self.conn = conn
        self._stuck_after = stuck_after
        self.group_id = group_id
        self._wake_within = wake_within
        self._origin = origin
        r = tables.render
        self.channel = outbox_channel(tables.schema)
        self.deadline_channel = deadline_channel(tables.schema)
        self._lock_owned = r(sql.LOCK_OWNED)
        self._claim = r(sql.CLAIM)
        self._read_offsets = r(sql.READ_OFFSETS)
        self._load_sagas = r(sql.LOAD_SAGAS)
        self._load_tombstones = r(sql.LOAD_TOMBSTONES)
        self._load_applied = r(sql.LOAD_APPLIED)
        self._load_deadlines = r(sql.LOAD_DEADLINES)
        self._load_lease = r(sql.LOAD_LEASE)
        self._insert_sagas = r(sql.INSERT_SAGAS)
        self._update_sagas = r(sql.UPDATE_SAGAS)
        self._insert_history = r(sql.INSERT_HISTORY)
        self._insert_outbox = r(sql.INSERT_OUTBOX)
        self._clear_deadlines = r(sql.CLEAR_DEADLINES)
        self._delete_deadlines = r(sql.DELETE_DEADLINES)
        self._insert_deadlines = r(sql.INSERT_DEADLINES)
        self._insert_dead_letters = r(sql.INSERT_DEAD_LETTERS)
        self._reset_deadlines = r(sql.RESET_DEADLINES)
        self._release_held = r(sql.RELEASE_HELD)
        self._fire_now = r(sql.FIRE_NOW)
        self._insert_parked = r(sql.INSERT_PARKED)
        self._commit_offsets = r(sql.COMMIT_OFFSETS)
        self._insert_audit = r(sql.INSERT_AUDIT)
        # The batch's combined write statements, by the parts a batch has (see _combine).
        self._combined: dict[tuple[bool, ...], str] = {}
        # On Citus each part of a batch's write goes as a statement of its own (see write).
        with conn.transaction():
            self._buckets = read_layout(conn, tables.schema)
            self._separate = self._buckets is not None or distributed(conn, tables.schema)
        self._operator = OperatorReads(tables, self._buckets)
        self._colocation = colocation if self._buckets is not None else None
        self._saga_table = tables.q("saga_instance")
        self._offsets_table = tables.render("{offsets}")
        if self._buckets is not None:
            self._by_bucket = _BucketStatements(tables)
            self._refresh_colocation()

    @property
    def buckets(self) -> Buckets | None:
        """How the tables are distributed by bucket; None when they are not."""
        return self._buckets

    def _refresh_colocation(self) -> None:
        if self._colocation is not None and self._buckets is not None:
            with self.conn.transaction():
                self._colocation.refresh(self.conn, self._buckets, self._saga_table)

    # -- partitions --------------------------------------------------------------------------

    def claim(
        self, partitions: Sequence[tuple[str, int]], owner: str
    ) -> dict[tuple[str, int], tuple[int, int | None]]:
        """Takes ownership: bumps each partition's epoch, so older owners' commits fail."""
        topics, numbers = [t for t, _ in partitions], [p for _, p in partitions]
        try:
            with self.conn.transaction():
                # Bounded: a claim the old owner's relay holds up (a slow flush) fails as
                # retryable (55P03), and the worker keeps the partitions paused and tries again.
                if self._separate:
                    # On Citus the rows are locked on a worker, which sees the bound only if
                    # the coordinator passes it on (by default it passes on no SET): without
                    # it a claim waited as long as the old owner's relay held the rows.
                    self.conn.execute("SET LOCAL citus.propagate_set_commands = 'local'")
                self.conn.execute(f"SET LOCAL lock_timeout = '{CLAIM_LOCK_TIMEOUT_MS}ms'")
                if self._buckets is not None:
                    rows = self._claim_by_bucket(self._buckets, partitions, owner)
                else:
                    self.conn.execute(self._lock_owned, (self.group_id, topics, numbers))
                    rows = self.conn.execute(
                        self._claim, (self.group_id, owner, topics, numbers)
                    ).fetchall()
        except psycopg.errors.LockNotAvailable as e:
            # Who holds the rows says whether the wait is a slow flush or a frozen process.
            why = f"rows busy (55P03): {e.diag.message_primary}; {self._holders()}"
            if self._stuck_after is not None:
                # A process frozen mid-statement is one the server never times out: the next
                # try finds its rows free once it is ended here.
                ended = end_stuck_holders(self.conn, self._offsets_table, self._stuck_after)
                why = "; ".join([why, *ended])
            raise LockBusy(why) from e
        return {(t, p): (epoch, nxt) for t, p, epoch, nxt in rows}

    def _holders(self) -> str:
        """The other sessions holding locks on the offsets table, for a claim that waited."""
        try:
            with self.conn.transaction():
                found = self.conn.execute(_HOLDERS, (self._offsets_table,)).fetchall()
        except psycopg.Error:
            return "their holders could not be read"
        if not found:
            return "held by no session now"
        return "held by " + "; ".join(
            f"pid {pid} ({app or '-'}, {state}, waiting on {event or 'nothing'}, "
            f"{age} s in its transaction: {query})"
            for pid, app, state, event, age, query in found
        )

    def _claim_by_bucket(
        self, buckets: Buckets, partitions: Sequence[tuple[str, int]], owner: str
    ) -> list[Any]:
        """`claim`'s statements once per bucket the partitions' offsets rows live in."""
        rows: list[Any] = []
        by = _grouped(partitions, lambda tp: buckets.of_partition(tp[1]))
        for bucket, group in sorted(by.items()):
            topics, numbers = [t for t, _ in group], [p for _, p in group]
            s = self._by_bucket
            self.conn.execute(s.lock_owned, (bucket, self.group_id, topics, numbers))
            rows += self.conn.execute(
                s.claim, (bucket, self.group_id, owner, topics, numbers)
            ).fetchall()
        return rows

    def read_offsets(
        self, partitions: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[int, int | None]]:
        buckets = self._buckets
        with self.conn.transaction():
            if buckets is None:
                rows = self.conn.execute(
                    self._read_offsets,
                    (self.group_id, [t for t, _ in partitions], [p for _, p in partitions]),
                ).fetchall()
            else:
                # Once per bucket, routed: the partitions of a worker that answers are read
                # while another does not (a place set aside waits for its own).
                rows = []
                by = _grouped(partitions, lambda tp: buckets.of_partition(tp[1]))
                for bucket, group in sorted(by.items()):
                    rows += self.conn.execute(
                        self._by_bucket.read_offsets,
                        (bucket, self.group_id, [t for t, _ in group], [p for _, p in group]),
                    ).fetchall()
        return {(t, p): (epoch, nxt) for t, p, epoch, nxt in rows}

    # -- one batch -------------------------------------------------------------------------

    def load_alone(self, wants: Wants) -> Loaded:
        """`load` as a transaction of its own, in one round trip.

        Autocommit for the call: the pipeline's statements up to its one Sync then run in one
        implicit transaction, without the BEGIN and the COMMIT that would each cost a round trip
        of their own (on a busy replica a round trip also waits for the interpreter's lock).
        The reads take no row locks, so nothing waits on this transaction.
        """
        conn = self.conn
        if self._colocation is not None and self._colocation.due():
            self._refresh_colocation()
        if conn.autocommit:
            return self.load(wants)
        conn.autocommit = True
        try:
            return self.load(wants)
        finally:
            # A connection that broke is replaced whole; its flag no longer matters (and
            # setting it would raise over the error that broke it).
            if not conn.closed and not conn.broken:
                conn.autocommit = False

    def load(self, wants: Wants) -> Loaded:
        """Reads every row the planner needs in one pipelined round trip."""
        keys = sorted(wants.saga_keys)
        mkeys = sorted(wants.message_keys)
        ids = sorted(wants.deadline_ids)
        with self.conn.pipeline():
            c0 = self.conn.execute("SELECT now()")
            c1: list[Any] = []
            c5: list[Any] = []
            c2: list[Any] = []
            if self._buckets is not None:
                together = self._load_by_bucket(self._buckets, keys, mkeys)
            else:
                together = []
                saga_keys = (batch_rows.encode_keys(keys),)
                c1 = [self.conn.execute(self._load_sagas, saga_keys)]
                # After the sagas, never before: each statement reads its own snapshot, and
                # retention deletes an instance and writes its tombstone in one transaction, so
                # a saga purged between the two reads is seen in both, never in neither.
                c5 = [self.conn.execute(self._load_tombstones, saga_keys)]
                c2 = (
                    [
                        self.conn.execute(
                            self._load_applied, (batch_rows.encode_message_keys(mkeys),)
                        )
                    ]
                    if mkeys
                    else []
                )
            c3 = self.conn.execute(self._load_deadlines, (ids,)) if ids else None
            hk = wants.held_keys
            c4 = self.conn.execute(self._load_lease, (LEASE_NAME,)) if ids or hk else None
            # Rows only operator records need: none for a batch of events.
            operator = self._operator.send(self.conn, wants)
        saga_rows = [row for c in c1 for row in c.fetchall()]
        tombstone_rows = [row for c in c5 for row in c.fetchall()]
        applied_rows = [row for c in c2 for row in c.fetchall()]
        for c in together:
            for kind, t, i, state, status, version, reason, sv, m in c.fetchall():
                if kind == 0:
                    saga_rows.append((t, i, state, status, version, reason, sv))
                elif kind == 1:
                    tombstone_rows.append((t, i))
                else:
                    applied_rows.append((t, i, m))
        sagas = {
            (t, i): SagaRow(t, i, state, SagaStatus(status), version, reason, sv)
            for t, i, state, status, version, reason, sv in saga_rows
        }
        applied = {(t, i, m) for t, i, m in applied_rows}
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
        tombstones = {(t, i) for t, i in tombstone_rows}
        extra = self._operator.receive(operator)
        deadlines.update(extra.deadlines)
        return Loaded(
            sagas,
            applied,
            deadlines,
            int(lease[0]) if lease else None,
            now_row[0],
            tombstones=tombstones,
            held=extra.held,
            decided=extra.decided,
            history=extra.history,
        )

    def _load_by_bucket(
        self, buckets: Buckets, keys: list[SagaKey], mkeys: list[tuple[str, str, str]]
    ) -> list[Any]:
        """The load's saga reads, one statement per bucket of the batch routed to its worker."""
        by_saga = _grouped(keys, lambda k: buckets.of(k[1]))
        by_message = _grouped(mkeys, lambda k: buckets.of(k[1]))
        return [
            self.conn.execute(
                self._by_bucket.load,
                {
                    "keys": batch_rows.encode_keys(by_saga.get(bucket, [])),
                    "mkeys": batch_rows.encode_message_keys(by_message.get(bucket, [])),
                    "bucket": bucket,
                },
            )
            for bucket in sorted(by_saga.keys() | by_message.keys())
        ]

    def write(self, ws: WriteSet, offsets: Sequence[OffsetCommit]) -> None:
        """Writes the batch; raises FencedOut or ConcurrentUpdate (the caller rolls back)."""
        if self._buckets is not None:
            self._write_by_bucket(self._buckets, ws, offsets)
            return
        conn = self.conn
        new = [s for s in ws.sagas if s.expected_version is None]
        old = [s for s in ws.sagas if s.expected_version is not None]
        # The round trips are few: the rows of every table go in one statement. (On Citus,
        # where they go as several, those are pipelined: see _write_apart.)
        # Fencing first: the offsets' compare-and-set also locks those rows against a claim, and
        # a batch whose partitions were taken over stops there, before it writes a saga row (a
        # stale batch would otherwise fail on a saga's key and look like a data error). In the
        # combined statement every row's write waits for its verdict (see _combine); a batch
        # that deletes deadline rows sets it apart, as those deletes must precede the inserts.
        fence: list[Any] = (
            [
                [o.topic for o in offsets],
                [o.partition for o in offsets],
                [o.next_offset for o in offsets],
                [o.expected for o in offsets],
                [o.epoch for o in offsets],
                self.group_id,
            ]
            if offsets
            else []
        )
        folded = (
            bool(offsets)
            and not ws.deadline_clears
            and not ws.deadline_deletes
            and not self._separate
        )
        if offsets and not folded:
            committed = conn.execute(self._commit_offsets, fence)
            self._check_fence(offsets, committed.fetchall())
        # Deadline rows a schedule replaces (or an end clears) are deleted before the combined
        # statement inserts their successors: its parts all see the same snapshot, so a delete
        # beside an insert of the same name would not make room for it.
        if ws.deadline_clears:
            conn.execute(self._clear_deadlines, (batch_rows.encode_keys(ws.deadline_clears),))
        if ws.deadline_deletes:
            conn.execute(
                self._delete_deadlines, (batch_rows.encode_message_keys(ws.deadline_deletes),)
            )
        params: list[Any] = [*fence, len(offsets)] if folded else []
        if new:
            params.append(batch_rows.encode_new_sagas(map(batch_rows.new_saga_fields, new)))
        if old:
            params.append(batch_rows.encode_old_sagas(map(batch_rows.old_saga_fields, old)))
        if ws.history:
            h = ws.history
            params += (
                batch_rows.encode_history(map(batch_rows.history_fields, h)),
                [x.payload for x in h],
                [x.payload_sha256 for x in h],
            )
        if ws.outbox:
            o = ws.outbox
            params += (
                batch_rows.encode_outbox(map(batch_rows.outbox_fields, o)),
                [r.key for r in o],
                [r.value for r in o],
            )
        if ws.deadline_inserts:
            params.append(
                batch_rows.encode_deadlines(map(batch_rows.deadline_fields, ws.deadline_inserts))
            )
        # At most one notification per channel and batch (Postgres also folds repeats within a
        # transaction): the outbox's wakes every replica's relay; the deadlines' wakes the
        # deadline poller (in any replica) in case this one is due sooner. Both are delivered
        # at commit, wherever in the transaction they are sent.
        wake_relay = bool(ws.outbox)
        within = self._wake_within
        wake_poller = ws.wakes_poller(None if within is None else datetime.now(UTC) + within)
        if wake_relay:
            params += (self.channel, self._origin)
        if wake_poller:
            params += (self.deadline_channel, self._origin)
        shape = (
            folded,
            bool(new),
            bool(old),
            bool(ws.history),
            bool(ws.outbox),
            bool(ws.deadline_inserts),
            wake_relay,
            wake_poller,
        )
        if self._separate:
            self._write_apart(shape[1:], params, len(old))
        elif any(shape):
            statement = self._combined.get(shape)
            if statement is None:
                statement = self._combined[shape] = self._combine(*shape)
            row = conn.execute(statement, params).fetchone()
            assert row is not None
            updated, topics, partitions = row[:3]
            if folded:
                self._check_fence(offsets, zip(topics or (), partitions or (), strict=True))
            if old and updated != len(old):
                moved = len(old) - updated
                raise ConcurrentUpdate(f"{moved} saga rows changed under the batch")
        self._write_rest(ws)

    def _write_rest(self, ws: WriteSet, buckets: Buckets | None = None) -> None:
        """The batch's rarer writes: operator changes, dead letters, parked records, audit."""
        conn = self.conn
        if ws.deadline_resets:
            rs = ws.deadline_resets
            conn.execute(self._reset_deadlines, ([x[0] for x in rs], [x[1] for x in rs]))
        if ws.deadline_fire_now:
            f = ws.deadline_fire_now
            conn.execute(self._fire_now, ([x[0] for x in f], [x[1] for x in f], [x[2] for x in f]))
        if ws.dead_letters:
            dl = ws.dead_letters
            columns: list[Any] = [
                [x.record.topic for x in dl],
                [x.record.partition for x in dl],
                [x.record.offset for x in dl],
                [x.record.key for x in dl],
                [x.record.value for x in dl],
                [batch_rows.json_text(x.record.headers_text()) for x in dl],
                [x.reason for x in dl],
                [x.detail for x in dl],
            ]
            if buckets is None:
                conn.execute(self._insert_dead_letters, columns)
            else:
                columns.append([buckets.of_partition(x.record.partition) for x in dl])
                conn.execute(self._by_bucket.insert_dead_letters, columns)
        if ws.held_releases:
            conn.execute(self._release_held, (ws.held_releases,))
        if ws.parked:
            self.insert_parked(ws.parked)
        if ws.audit:
            conn.execute(self._insert_audit, (encode_entries(ws.audit),))

    def _write_apart(self, shape: tuple[bool, ...], params: list[Any], old: int) -> None:
        """The combined statement's parts one after another, in its order, with its parameters.

        For Citus: the coordinator runs each data-modifying CTE of a combined statement as a
        plan of its own and sends every plan's result to every worker, so a batch would hold
        open a transaction on each worker, not only on the one its schema lives on.

        In a pipeline, after the fence: S8's drains through the coordinator went from 0.76x of
        single PostgreSQL to 0.80-0.89x, by bucket from 0.72-0.75x to 0.76-0.86x. A replica
        frozen inside the pipeline, or right after it (psycopg's flush request after the Sync
        stops the server's idle timer), is one the server never ends: the heir's claim does
        (:mod:`processor._postgres.stuck`).
        """
        conn = self.conn
        new, has_old, history, outbox, deadlines, wake_relay, wake_poller = shape
        rest = iter(params)
        parts = [
            (self._insert_sagas, new, 1),
            (self._update_sagas, has_old, 1),
            (self._insert_history, history, 3),
            (self._insert_outbox, outbox, 3),
            (self._insert_deadlines, deadlines, 1),
        ]
        updated = None
        with conn.pipeline():
            for statement, on, count in parts:
                if not on:
                    continue
                done = conn.execute(statement, [next(rest) for _ in range(count)])
                if statement is self._update_sagas:
                    updated = done
            for _ in range(wake_relay + wake_poller):
                conn.execute("SELECT pg_notify(%s, %s)", (next(rest), next(rest)))
        if updated is not None and updated.rowcount != old:
            raise ConcurrentUpdate(f"{old - updated.rowcount} saga rows changed under the batch")

    @staticmethod
    def _check_fence(offsets: Sequence[OffsetCommit], moved: Iterable[tuple[str, int]]) -> None:
        lost = {(o.topic, o.partition) for o in offsets} - {(t, p) for t, p in moved}
        if lost:
            raise FencedOut(lost)

    def _combine(
        self,
        fence: bool,
        new: bool,
        old: bool,
        history: bool,
        outbox: bool,
        deadlines: bool,
        wake_relay: bool,
        wake_poller: bool,
    ) -> str:
        """One statement for the batch's rows: each table's write a data-modifying CTE.

        Postgres runs every data-modifying CTE to completion whether or not the query reads
        it; the outer SELECT returns the updated sagas' count and the partitions whose offsets
        moved, and sends the notifications. Parameters follow in the order of the parts.

        With ``fence``, the offsets' compare-and-set comes first and every other write is
        gated on its verdict: each one's first step (an init plan, run before it reads a row)
        reads the count of offsets rows that moved, which runs the compare-and-set to its end.
        A batch whose partitions were taken over writes no other row; the caller raises
        FencedOut and rolls the moved offsets back.
        """
        gate = " (SELECT ok FROM fence)" if fence else ""
        ctes = []
        if fence:
            ctes += [
                f"moved AS ({self._commit_offsets.strip()})",
                "fence AS (SELECT count(*) = %s AS ok FROM moved)",
            ]

        def gated_insert(text: str) -> str:
            if not fence:
                return text.strip()
            # INSERT INTO t (columns) SELECT ... -> the same rows, only if the fence holds.
            # The templates start their SELECT on a line of its own (see the sql module).
            head, rows = text.split("\nSELECT ", 1)
            return f"{head}\nSELECT * FROM (SELECT {rows}) AS r WHERE{gate}"

        update = self._update_sagas.strip() + (f" AND{gate}" if fence else "") + " RETURNING 1"
        parts = [
            (gated_insert(self._insert_sagas), new),
            (update, old),
            (gated_insert(self._insert_history), history),
            (gated_insert(self._insert_outbox), outbox),
            (gated_insert(self._insert_deadlines), deadlines),
        ]
        ctes += [f"w{n} AS ({text})" for n, (text, on) in enumerate(parts) if on]
        outputs = [
            "(SELECT count(*) FROM w1)" if old else "0",
            "(SELECT array_agg(topic) FROM moved)" if fence else "NULL::text[]",
            "(SELECT array_agg(partition) FROM moved)" if fence else "NULL::int[]",
        ]
        outputs += ["pg_notify(%s, %s)"] * (wake_relay + wake_poller)
        head = f"WITH {', '.join(ctes)} " if ctes else ""
        return f"{head}SELECT {', '.join(outputs)}"

    def insert_parked(self, rows: Sequence[Any]) -> None:
        columns: list[Any] = [
            [x.saga_type for x in rows],
            [x.saga_id for x in rows],
            [x.record.topic for x in rows],
            [x.record.partition for x in rows],
            [x.record.offset for x in rows],
            [x.record.key for x in rows],
            [x.record.value or b"" for x in rows],
            [batch_rows.json_text(x.record.headers_text()) for x in rows],
            [x.reason for x in rows],
        ]
        if self._buckets is None:
            self.conn.execute(self._insert_parked, columns)
        else:
            columns.append([self._buckets.of(x.saga_id) for x in rows])
            self.conn.execute(self._by_bucket.insert_parked, columns)

    def _write_by_bucket(
        self, buckets: Buckets, ws: WriteSet, offsets: Sequence[OffsetCommit]
    ) -> None:
        """`write` for tables distributed by bucket: the same parts in the same order.

        The rows are pipelined after the fence, as in `_write_apart`. Each statement that names
        sagas or partitions runs once per bucket, with it as a constant; each insert carries
        every row's bucket (Citus sends the rows to their shards).
        """
        conn, s = self.conn, self._by_bucket
        if offsets:
            moved: list[Any] = []
            for bucket, group in sorted(
                _grouped(offsets, lambda o: buckets.of_partition(o.partition)).items()
            ):
                fence = [
                    [o.topic for o in group],
                    [o.partition for o in group],
                    [o.next_offset for o in group],
                    [o.expected for o in group],
                    [o.epoch for o in group],
                    bucket,
                    self.group_id,
                ]
                moved += conn.execute(s.commit_offsets, fence).fetchall()
            self._check_fence(offsets, moved)
        with conn.pipeline():
            updated = self._write_buckets_rows(buckets, ws)
        for done, expected in updated:
            if done.rowcount != expected:
                moved_n = expected - done.rowcount
                raise ConcurrentUpdate(f"{moved_n} saga rows changed under the batch")
        self._write_rest(ws, buckets)

    def _write_buckets_rows(
        self, buckets: Buckets, ws: WriteSet
    ) -> list[tuple[psycopg.Cursor[Any], int]]:
        """The batch's rows by bucket, into an open pipeline; each update with its row count."""
        conn, s, of = self.conn, self._by_bucket, buckets.of
        for bucket, keys in sorted(_grouped(ws.deadline_clears, lambda k: of(k[1])).items()):
            conn.execute(s.clear_deadlines, (batch_rows.encode_keys(keys), bucket))
        for bucket, mkeys in sorted(_grouped(ws.deadline_deletes, lambda k: of(k[1])).items()):
            conn.execute(s.delete_deadlines, (batch_rows.encode_message_keys(mkeys), bucket))
        new = [x for x in ws.sagas if x.expected_version is None]
        old = [x for x in ws.sagas if x.expected_version is not None]
        if new:
            rows = [(*batch_rows.new_saga_fields(x), of(x.saga_id)) for x in new]
            conn.execute(s.insert_sagas, (batch_rows.encode_new_sagas_b(rows),))
        updated = []
        for bucket, sagas in sorted(_grouped(old, lambda x: of(x.saga_id)).items()):
            encoded = batch_rows.encode_old_sagas(map(batch_rows.old_saga_fields, sagas))
            updated.append((conn.execute(s.update_sagas, (encoded, bucket)), len(sagas)))
        if ws.history:
            h = ws.history
            rows = [(*batch_rows.history_fields(x), of(x.saga_id)) for x in h]
            conn.execute(
                s.insert_history,
                (
                    batch_rows.encode_history_b(rows),
                    [x.payload for x in h],
                    [x.payload_sha256 for x in h],
                ),
            )
        if ws.outbox:
            o = ws.outbox
            rows = [(*batch_rows.outbox_fields(r), buckets.of_row(r.saga_id, r.source)) for r in o]
            conn.execute(
                s.insert_outbox,
                (batch_rows.encode_outbox_b(rows), [r.key for r in o], [r.value for r in o]),
            )
        if ws.deadline_inserts:
            rows = [(*batch_rows.deadline_fields(d), of(d.saga_id)) for d in ws.deadline_inserts]
            conn.execute(s.insert_deadlines, (batch_rows.encode_deadlines_b(rows),))
        within = self._wake_within
        if ws.outbox:
            conn.execute("SELECT pg_notify(%s, %s)", (self.channel, self._origin))
        if ws.wakes_poller(None if within is None else datetime.now(UTC) + within):
            conn.execute("SELECT pg_notify(%s, %s)", (self.deadline_channel, self._origin))
        return updated


_K = TypeVar("_K")


def _grouped(items: Iterable[_K], bucket: Callable[[_K], int]) -> dict[int, list[_K]]:
    found: dict[int, list[_K]] = {}
    for item in items:
        found.setdefault(bucket(item), []).append(item)
    return found


class _BucketStatements:
    """The statements of :mod:`processor._postgres.batch.sql_buckets`, rendered once."""

    def __init__(self, tables: Tables) -> None:
        r = tables.render
        self.read_offsets = r(sql_buckets.READ_OFFSETS)
        self.lock_owned = r(sql_buckets.LOCK_OWNED)
        self.claim = r(sql_buckets.CLAIM)
        self.load = r(sql_buckets.LOAD)
        self.insert_sagas = r(sql_buckets.INSERT_SAGAS)
        self.update_sagas = r(sql_buckets.UPDATE_SAGAS)
        self.insert_history = r(sql_buckets.INSERT_HISTORY)
        self.insert_outbox = r(sql_buckets.INSERT_OUTBOX)
        self.clear_deadlines = r(sql_buckets.CLEAR_DEADLINES)
        self.delete_deadlines = r(sql_buckets.DELETE_DEADLINES)
        self.insert_deadlines = r(sql_buckets.INSERT_DEADLINES)
        self.insert_dead_letters = r(sql_buckets.INSERT_DEAD_LETTERS)
        self.insert_parked = r(sql_buckets.INSERT_PARKED)
        self.commit_offsets = r(sql_buckets.COMMIT_OFFSETS)
