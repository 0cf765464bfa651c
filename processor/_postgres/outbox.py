"""The relay's side of the store in PostgreSQL: claim committed outbox rows, in id order.

A claim is one transaction on the adapter's own connection. Each row carries the input
partition whose record caused it, and the relay of that partition's owner publishes it: the
claim locks the offsets rows of the partitions it claims for (``FOR KEY SHARE``) where the owner
epoch is still the one this replica holds, and takes only rows of those partitions. A new owner
bumps the epoch under ``FOR UPDATE``, so it waits for a claim in flight to end (published and
committed, or rolled back); afterwards the old owner's claims find the epoch moved and take
nothing of that partition. So a partition's rows go out in id order from one relay at a time,
while replicas owning different partitions publish at the same time. Rows of no partition
(written before rows carried one, and every row of a participant's outbox) are claimed by
whichever relay gets a transaction-scoped advisory lock, one relay at a time.

One saga's rows may come from several sources: rows of no partition written before its rows
carried one, and, once an input topic grew, rows of its old partition and of its new one (a saga
parked before the growth and retried later writes under the old one again). A partition row
stays in the outbox while an older row of its saga from another source is still there, so that
the relays of different sources never reorder a saga's commands. The saga's oldest row is never
held back, so every saga moves on as soon as its owners' relays run. Rows of no partition need
no such guard: they are older than every partition row of their saga (the processor has written
the source on every row since the column was added, and a retry puts a row back under its own
id).

The claimed rows are deleted and returned; the delete commits only when the caller's block ends
normally, after every record was acknowledged. Rows are claimed by what is committed, never by
"id > last seen", so a row that a slower transaction commits late is not skipped.

Rows the relay does not publish are settled in the same transaction: put back under their own
id (one more attempt counted), or moved to the failed outbox. Each claimed row says whether its
saga already has a row in the failed outbox, so that it is held behind it. Operators moving
failed rows take both advisory locks exclusively (partition claims hold the second one shared),
so no row of the failed outbox moves while any relay decides about its saga.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg.types.numeric import Int4

from processor._engine.buckets import Buckets
from processor._engine.records import OutboxRow
from processor._ports import TP, OutboxEntry, SetAside
from processor._postgres.colocation import Colocation
from processor._postgres.held import Conn, HeldConnection
from processor._postgres.places import RelayPlaces
from processor._postgres.schema.buckets import layout_mark
from processor._postgres.schema.tables import Tables

__all__ = ["PostgresOutboxStore", "partition_lock_key", "relay_lock_key"]


_MAX_ID = 9223372036854775807

# Seconds between looks for rows of no partition by a relay with partitions to claim for, on
# tables distributed by bucket.
GLOBAL_EVERY_S = 1.0

# Seconds a worker whose relay round failed is passed over while the others answer (tables
# distributed by bucket): a stopped worker costs the others one failed round in this many.
REST_S = 5.0
# Seconds the input topics' partition counts are used before they are read again (buckets).
_COUNTS_FOR_S = 5.0
_RETURNING = """
    RETURNING id, saga_type, saga_id, topic, partition, key, headers, value, attempts,
        (SELECT min(f.id) FROM {failed_outbox} AS f
          WHERE o.saga_id IS NOT NULL
            AND f.saga_type = o.saga_type AND f.saga_id = o.saga_id),
        created_at, source_topic, source_partition
"""
# A claim's bytes: what the relay holds in memory for the round. A row is taken while the rows
# before it hold fewer than max_bytes, so the first is always taken, however large.
_SIZE = "octet_length(value) + coalesce(octet_length(key), 0) AS size"
# ``id = ANY(ARRAY(...))``: the delete finds the claimed ids through the primary key whatever the
# outbox's size, where ``id IN (...)`` may be planned as a scan of the whole table.
_CLAIM_GLOBAL = (
    """
    DELETE FROM {outbox} AS o WHERE id = ANY(ARRAY(
        SELECT w.id FROM (
            SELECT c.id, sum(c.size) OVER (ORDER BY c.id) - c.size AS before
              FROM (SELECT id, SIZE FROM {outbox} WHERE source_topic IS NULL
                     ORDER BY id LIMIT %(limit)s FOR UPDATE) AS c) AS w
         WHERE w.before < %(max_bytes)s))
    """
    + _RETURNING
).replace("SIZE", _SIZE)
# SKIP LOCKED: a partition whose new owner is bumping the epoch (FOR UPDATE) is being handed
# over; waiting for it would only find the epoch moved, and could deadlock with a claim of
# several partitions. Each partition's oldest rows come from its own index; the saga guard may
# then leave some out (it only ever holds rows back).
#
# The guard: a row is held while an older row of its saga from another source is in the outbox.
# Take the nearest such row: the saga's next row after it is of the held row's source and no newer
# than the held row, so it is among its partition's oldest rows, in this window. A row is thus
# held exactly when it, or an older row of its saga and source in the window, comes right after a
# row of another source: each row needs only the saga's row just before it, one backward probe of
# the saga index whatever the saga's size. An EXISTS over every older row of the saga would read
# a busy saga's rows again for each later one, and may be planned as a hash join over the whole
# outbox.
#
# The delete locks the rows it takes, and skips one that another transaction deleted meanwhile:
# no FOR UPDATE beforehand, which would lock (and log) every row a second time. Claims never
# contend for a row (one owner epoch per partition, and operators moving rows hold the advisory
# lock that partition claims share), so the order rows are locked in does not matter.
_CLAIM_OWNED = """
    WITH mine AS (
        SELECT s.topic, s.partition FROM {offsets} AS s
          JOIN unnest(%(t)s::text[], %(p)s::int[], %(e)s::bigint[]) AS u(t, p, e)
            ON s.topic = u.t AND s.partition = u.p AND s.owner_epoch = u.e
         WHERE s.group_id = %(group)s
           FOR KEY SHARE OF s SKIP LOCKED
    ), first AS (
        SELECT c.* FROM mine CROSS JOIN LATERAL (
            SELECT x.id, X_SIZE, x.saga_type, x.saga_id, x.source_topic, x.source_partition
              FROM {outbox} AS x
             WHERE x.source_topic = mine.topic AND x.source_partition = mine.partition
             ORDER BY x.id LIMIT %(limit)s) AS c
         ORDER BY c.id LIMIT %(limit)s
    ), oldest AS (
        SELECT * FROM (
            SELECT f.*, sum(f.size) OVER (ORDER BY f.id) - f.size AS before FROM first AS f) AS w
         WHERE w.before < %(max_bytes)s
    ), free AS (
        SELECT g.id FROM (
            SELECT c.id, bool_or(b.other) OVER (
                       PARTITION BY c.saga_type, c.saga_id, c.source_topic, c.source_partition
                       ORDER BY c.id) AS held
              FROM oldest AS c LEFT JOIN LATERAL (
                  SELECT n.source_topic IS DISTINCT FROM c.source_topic
                         OR n.source_partition IS DISTINCT FROM c.source_partition AS other
                    FROM {outbox} AS n
                   WHERE n.saga_type = c.saga_type AND n.saga_id = c.saga_id AND n.id < c.id
                   ORDER BY n.id DESC LIMIT 1) AS b ON true) AS g
         WHERE g.held IS NOT TRUE
    )
    DELETE FROM {outbox} AS o WHERE id = ANY(ARRAY(SELECT id FROM free))
""".replace("X_SIZE", "octet_length(x.value) + coalesce(octet_length(x.key), 0) AS size")


# Tables distributed by bucket (processor/_postgres/schema/buckets.py): each statement names one
# bucket, so Citus routes it to the worker that holds it (Citus takes row locks only in such
# statements). The owned partitions' offsets rows are locked first, each bucket's on its own;
# then each bucket their sagas' rows can be in is claimed from, the partitions passed as values.
_LOCK_OWNED_B = """
    SELECT s.topic, s.partition FROM {offsets} AS s
      JOIN unnest(%(t)s::text[], %(p)s::int[], %(e)s::bigint[]) AS u(t, p, e)
        ON s.topic = u.t AND s.partition = u.p AND s.owner_epoch = u.e
     WHERE s.bucket = %(bucket)s::int AND s.group_id = %(group)s
       FOR KEY SHARE OF s SKIP LOCKED
"""
# _CLAIM_OWNED's reads of the outbox within one bucket, named as a constant (tables by bucket).
_OWNED_IN_BUCKET = _CLAIM_OWNED.replace(
    "WHERE x.source_topic = mine.topic",
    "WHERE x.bucket = %(bucket)s::int AND x.source_topic = mine.topic",
).replace(
    "WHERE n.saga_type = c.saga_type",
    "WHERE n.bucket = %(bucket)s::int AND n.saga_type = c.saga_type",
)
_RETURNING_B = _RETURNING.replace(
    "WHERE o.saga_id IS NOT NULL", "WHERE f.bucket = %(bucket)s::int AND o.saga_id IS NOT NULL"
)
# The rows to take, chosen as _CLAIM_OWNED chooses them from the partitions passed; then deleted
# by id with the bucket as a constant. One statement would be planned over every shard: Citus
# computes the window functions on the coordinator and then sends the delete to every shard.
# (Used where a topic's count spreads a partition's sagas over several buckets; otherwise
# _CLAIM_OWNED_B below.)
_CHOOSE_OWNED_B = _OWNED_IN_BUCKET.replace(
    """    WITH mine AS (
        SELECT s.topic, s.partition FROM {offsets} AS s
          JOIN unnest(%(t)s::text[], %(p)s::int[], %(e)s::bigint[]) AS u(t, p, e)
            ON s.topic = u.t AND s.partition = u.p AND s.owner_epoch = u.e
         WHERE s.group_id = %(group)s
           FOR KEY SHARE OF s SKIP LOCKED
    ), first""",
    """    WITH mine AS (
        SELECT * FROM unnest(%(t)s::text[], %(p)s::int[]) AS u(topic, partition)
    ), first""",
).replace(
    "DELETE FROM {outbox} AS o WHERE id = ANY(ARRAY(SELECT id FROM free))",
    "SELECT id FROM free",
)
# Rows of no partition: the one relay holding the global lock takes them (no row locks needed).
_CHOOSE_GLOBAL_B = """
    SELECT w.id FROM (
        SELECT c.id, sum(c.size) OVER (ORDER BY c.id) - c.size AS before
          FROM (SELECT id, SIZE FROM {outbox}
                 WHERE bucket = %(bucket)s::int AND source_topic IS NULL
                 ORDER BY id LIMIT %(limit)s) AS c) AS w
     WHERE w.before < %(max_bytes)s
""".replace("SIZE", _SIZE)
_DELETE_B = (
    "DELETE FROM {outbox} AS o WHERE o.bucket = %(bucket)s::int AND o.id = ANY(%(ids)s)"
    + _RETURNING_B
)

# A partition whose sagas are all its own bucket's (its topic's count a multiple of the buckets,
# the usual case): the lock, the choice and the delete of _CLAIM_OWNED in one statement, every
# table named with the bucket as a constant, so Citus sends the whole statement to the bucket's
# worker as one task (a router plan). Three statements per bucket and round cost the coordinator
# a third of its relay time in S8.
_CLAIM_OWNED_B = (
    _OWNED_IN_BUCKET.replace(
        "WHERE s.group_id = %(group)s",
        "WHERE s.bucket = %(bucket)s::int AND s.group_id = %(group)s",
    ).replace(
        "DELETE FROM {outbox} AS o WHERE id = ANY",
        "DELETE FROM {outbox} AS o WHERE o.bucket = %(bucket)s::int AND o.id = ANY",
    )
    + _RETURNING_B
)


class PostgresOutboxStore:
    """:class:`processor._ports.OutboxStore` over one PostgreSQL connection.

    The connection is opened on first use and again on the call after one broke (see
    :class:`processor._postgres.held.HeldConnection`); the call that met the break raises
    ``Retryable``.

    Args:
        connect: Opens a new connection (not in autocommit mode).
        tables: Where the processor's tables live.
        group_id: The consumer group whose offsets rows hold the owner epochs; None when the
            outbox has no partition rows (a participant's): every claim takes the global path.
        anchor: The table whose shards say where each bucket lives, on tables distributed by
            bucket (a participant's: ``inbox``).
    """

    def __init__(
        self,
        connect: Callable[[], Conn],
        tables: Tables,
        group_id: str | None = None,
        *,
        anchor: str = "saga_instance",
    ) -> None:
        self._held = HeldConnection(connect, layout=layout_mark(tables.schema))
        self._group_id = group_id
        self._lock_key = relay_lock_key(tables)
        self._shared_key = partition_lock_key(tables)
        self._claim_global = tables.render(_CLAIM_GLOBAL)
        self._claim_owned = tables.render(_CLAIM_OWNED + _RETURNING)
        # A kept row goes back under its own id: its place in the commit order stays.
        self._keep = tables.render(
            """
            INSERT INTO {outbox} (id, saga_type, saga_id, topic, partition, key, headers, value,
                                  created_at, source_topic, source_partition, attempts,
                                  last_error)
            OVERRIDING SYSTEM VALUE
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            """
        )
        self._move = tables.render(
            """
            INSERT INTO {failed_outbox} (id, saga_type, saga_id, topic, partition, key, headers,
                                         value, created_at, source_topic, source_partition,
                                         reason, attempts, held_behind)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            """
        )
        # The same, with the row's bucket (tables distributed by bucket).
        self._keep_b = self._keep.replace("last_error)", "last_error, bucket)").replace(
            "%s)", "%s, %s)"
        )
        self._move_b = self._move.replace("held_behind)", "held_behind, bucket)").replace(
            "%s)", "%s, %s)"
        )
        self._claimed: dict[int, tuple[OutboxEntry, object]] = {}
        self._tables = tables
        self._choose_global_b = tables.render(_CHOOSE_GLOBAL_B)
        self._choose_owned_b = tables.render(_CHOOSE_OWNED_B)
        self._delete_b = tables.render(_DELETE_B)
        self._lock_owned_b = tables.render(_LOCK_OWNED_B)
        self._claim_owned_b = tables.render(_CLAIM_OWNED_B)
        self._colocation = Colocation()
        self._saga_table = tables.q(anchor)
        # Which worker each round looks at (tables by bucket).
        self._places = RelayPlaces(REST_S)
        # When rows of no partition are looked for next (tables by bucket).
        self._global_due = 0.0
        self._counts: dict[str, int] = {}
        self._counts_until = 0.0
        self.more_waiting = False
        self._counts_b = tables.render(
            "SELECT topic, count FROM {partition_count} WHERE group_id = %s"
        )

    @contextmanager
    def claim(
        self,
        limit: int,
        owned: Mapping[TP, int] | None = None,
        max_bytes: int | None = None,
    ) -> Iterator[list[OutboxEntry] | None]:
        """Claims up to ``limit`` committed rows in id order, as one transaction.

        Takes the rows of no partition when no other relay holds the global lock, and the rows
        of each partition in ``owned`` whose owner epoch is still the one given, except those
        with an older row of their saga from another source still in the outbox.

        Yields None when there was nothing this claim may take: no partition to claim for and
        another relay holds the global lock. Leaving the block normally commits the delete;
        leaving it with an exception rolls it back and every row stays.

        Raises:
            Retryable: The database is unreachable or the connection broke; the next call
                reconnects.
            RuntimeFailure: Any other database error (fatal).
        """
        owned = owned if owned and self._group_id is not None else {}
        try:
            conn = self._held.get()
            with conn.transaction():
                got = conn.execute(
                    "SELECT pg_try_advisory_xact_lock(hashtext(%s)),"
                    " CASE WHEN %s THEN pg_try_advisory_xact_lock_shared(hashtext(%s)) END",
                    (self._lock_key, bool(owned), self._shared_key),
                ).fetchone()
                assert got is not None
                global_path, partitions = bool(got[0]), bool(got[1])
                if not global_path and not partitions:
                    yield None
                    return
                rows = []
                self.more_waiting = False
                budget = _MAX_ID if max_bytes is None else max_bytes
                buckets = self._layout(conn)
                if buckets is not None:
                    rows = self._claim_by_bucket(
                        conn, buckets, limit, owned if partitions else {}, budget, global_path
                    )
                elif global_path:
                    rows = conn.execute(
                        self._claim_global, {"limit": limit, "max_bytes": budget}, binary=True
                    ).fetchall()
                    budget -= sum(len(r[7] or b"") + len(r[5] or b"") for r in rows)
                if buckets is None and partitions and len(rows) < limit and budget > 0:
                    params = self._owned_params(limit - len(rows), owned, budget)
                    rows += conn.execute(self._claim_owned, params, binary=True).fetchall()
                # DELETE ... RETURNING has no defined order: restore commit order by id.
                rows.sort(key=lambda r: r[0])
                self._claimed = {r[0]: (_entry(r), r[10]) for r in rows}
                try:
                    yield [entry for entry, _created in self._claimed.values()]
                finally:
                    self._claimed = {}
        except psycopg.Error as e:
            raise self._held.failure(e) from e

    def _layout(self, conn: Conn) -> Buckets | None:
        return self._held.buckets(conn, self._tables.schema)

    def _claim_by_bucket(
        self,
        conn: Conn,
        buckets: Buckets,
        limit: int,
        owned: Mapping[TP, int],
        budget: int,
        global_path: bool,
    ) -> list[Any]:
        """`claim` over tables distributed by bucket: each statement routed to one worker.

        A claim that deleted rows on two workers would commit in two phases over both, so each
        round takes one worker's buckets (of no partition, on the global path) and partitions:
        :class:`processor._postgres.places.RelayPlaces` chooses the worker (the one a committed
        batch named, :meth:`expect`; each in turn after a wake-up no one named) and says
        whether to go on. A worker whose round failed is passed over for :data:`REST_S` while
        others answer: the others' rows go on while it is away. With a processor's batches
        naming their partitions, the relay takes about one round a batch (S8: 2.1, two thirds
        of them empty, with the workers simply in turn).
        """
        if self._colocation.due():
            self._colocation.refresh(conn, buckets, self._saga_table)
        if self._group_id is None:
            owned = {}
        # Rows of no partition are rare for a processor, and looking for them costs a routed
        # statement per bucket: with partitions to claim for, that look is taken at most every
        # GLOBAL_EVERY_S (it was a quarter of the relay's statement time in S8).
        now = time.monotonic()
        if global_path and owned and now < self._global_due:
            global_path = False
        elif global_path:
            self._global_due = now + GLOBAL_EVERY_S
        place, places = self._next_place(buckets, owned, global_path)
        try:
            rows = self._round(conn, buckets, limit, owned, budget, global_path, place)
        except psycopg.Error:
            if place is not None:
                self._places.failed(place)
            raise
        if place is None:
            self.more_waiting = False
        else:
            held = sum(len(r[7] or b"") + len(r[5] or b"") for r in rows)
            full = len(rows) >= limit or held >= budget
            self.more_waiting = self._places.done(place, found=bool(rows), full=full, order=places)
        return rows

    def _next_place(
        self, buckets: Buckets, owned: Mapping[TP, int], global_path: bool
    ) -> tuple[str | None, list[str]]:
        """The worker whose turn it is (None: one worker holds all), and every worker."""
        colocation = self._colocation
        found = {str(colocation(tp)) for tp in owned}
        if global_path:
            found |= {str(colocation.of_bucket(buckets.key(b))) for b in range(buckets.count)}
        order = sorted(found)
        if len(order) <= 1:
            return None, order
        return self._places.next(order), order

    def expect(self, partitions: Collection[TP] | None) -> None:
        self._places.expect(self._places_of(partitions) if partitions is not None else None)

    def _places_of(self, partitions: Collection[TP]) -> set[str] | None:
        """The workers that hold the rows of ``partitions``' sagas.

        None when that is not known: the layout or a count not read yet, or a count that
        spreads a partition's sagas over several buckets.
        """
        buckets, counts = self._held.known_buckets, self._counts
        if not isinstance(buckets, Buckets):
            return None
        places = set()
        for topic, partition in partitions:
            count = counts.get(topic)
            home = buckets.of_partition(partition)
            if not count or buckets.of_partition_sagas(partition, count) != (home,):
                return None
            places.add(str(self._colocation.of_bucket(home)))
        return places

    def _round(
        self,
        conn: Conn,
        buckets: Buckets,
        limit: int,
        owned: Mapping[TP, int],
        budget: int,
        global_path: bool,
        place: object,
    ) -> list[Any]:
        """One worker's rows (``place``; None: every worker's)."""
        colocation = self._colocation
        rows: list[Any] = []
        if global_path:
            for b in range(buckets.count):
                key = buckets.key(b)
                if place is not None and str(colocation.of_bucket(key)) != place:
                    continue
                step = {"bucket": Int4(key), "limit": limit - len(rows), "max_bytes": budget}
                got = self._take(conn, self._choose_global_b, step)
                rows += got
                budget -= sum(len(r[7] or b"") + len(r[5] or b"") for r in got)
                if len(rows) >= limit or budget <= 0:
                    return rows
        if place is not None:
            owned = {tp: e for tp, e in owned.items() if str(colocation(tp)) == place}
        if not owned:
            return rows
        counts = self._partition_counts(conn)
        by_bucket: dict[int, list[TP]] = {}
        for tp in sorted(owned):
            by_bucket.setdefault(buckets.of_partition(tp[1]), []).append(tp)
        if all(
            t in counts and buckets.of_partition_sagas(p, counts[t]) == (bucket,)
            for bucket, tps in by_bucket.items()
            for t, p in tps
        ):
            # Every partition's sagas are its own bucket's: one statement per bucket.
            for bucket, tps in sorted(by_bucket.items()):
                if len(rows) >= limit or budget <= 0:
                    break
                one = self._bucket_params(bucket, tps, owned)
                one.update(limit=limit - len(rows), max_bytes=budget)
                got = conn.execute(self._claim_owned_b, one, binary=True).fetchall()
                rows += got
                budget -= sum(len(r[7] or b"") + len(r[5] or b"") for r in got)
            return rows
        # The offsets rows of the owned partitions, locked where the epoch is still ours.
        passed: list[tuple[str, int]] = []
        for bucket, tps in sorted(by_bucket.items()):
            locking = self._bucket_params(bucket, tps, owned)
            passed += conn.execute(self._lock_owned_b, locking).fetchall()
        wanted = self._homes(buckets, passed, counts)
        for bucket, tps in sorted(wanted.items()):
            if len(rows) >= limit or budget <= 0:
                break
            claim: dict[str, object] = {
                "bucket": Int4(bucket),
                "t": [t for t, _ in tps],
                "p": [p for _, p in tps],
                "limit": limit - len(rows),
                "max_bytes": budget,
            }
            got = self._take(conn, self._choose_owned_b, claim)
            rows += got
            budget -= sum(len(r[7] or b"") + len(r[5] or b"") for r in got)
        return rows

    def _bucket_params(
        self, bucket: int, tps: Sequence[TP], owned: Mapping[TP, int]
    ) -> dict[str, object]:
        """The parameters naming one bucket's owned partitions and their epochs."""
        return {
            "bucket": Int4(bucket),
            "group": self._group_id,
            "t": [t for t, _ in tps],
            "p": [p for _, p in tps],
            "e": [owned[tp] for tp in tps],
        }

    @staticmethod
    def _homes(
        buckets: Buckets, partitions: Iterable[tuple[str, int]], counts: Mapping[str, int]
    ) -> dict[int, list[tuple[str, int]]]:
        """Each bucket the partitions' sagas can be in, with those partitions.

        One bucket a partition, unless its topic's count is not a multiple of the buckets.
        """
        wanted: dict[int, list[tuple[str, int]]] = {}
        for topic, partition in partitions:
            count = counts.get(topic)
            homes = (
                buckets.of_partition_sagas(partition, int(count))
                if count
                else tuple(buckets.key(b) for b in range(buckets.count))
            )
            for bucket in homes:
                wanted.setdefault(bucket, []).append((topic, partition))
        return wanted

    def _partition_counts(self, conn: Conn) -> Mapping[str, int]:
        """The input topics' partition counts the growth watch records, read every few seconds.

        They change only when a topic grows, and a growth keeps a partition's bucket (the growth
        watch takes multiples only).
        """
        now = time.monotonic()
        if now >= self._counts_until:
            self._counts = dict(conn.execute(self._counts_b, (self._group_id,)).fetchall())
            self._counts_until = now + _COUNTS_FOR_S
        return self._counts

    def _take(self, conn: Conn, choose: str, params: Mapping[str, object]) -> list[Any]:
        """The rows ``choose`` picks in one bucket, deleted and returned."""
        ids = [r[0] for r in conn.execute(choose, params).fetchall()]
        if not ids:
            return []
        taken = {"bucket": params["bucket"], "ids": ids}
        return conn.execute(self._delete_b, taken, binary=True).fetchall()

    def _owned_params(
        self, limit: int, owned: Mapping[TP, int], max_bytes: int
    ) -> dict[str, object]:
        tps = sorted(owned)
        return {
            "group": self._group_id,
            "t": [t for t, _ in tps],
            "p": [p for _, p in tps],
            "e": [owned[tp] for tp in tps],
            "limit": limit,
            "max_bytes": max_bytes,
        }

    def settle(self, set_aside: Sequence[SetAside], kept: Mapping[int, str | None]) -> None:
        """Within an open claim: puts ``kept`` rows back, moves ``set_aside`` ones aside.

        The claim's block, which this is called in, translates any database error.
        """
        if not self._claimed:
            raise RuntimeError("settle() outside an open claim")
        buckets = self._held.known_buckets

        def bucket(row_id: int) -> tuple[int, ...]:
            if buckets is None:
                return ()
            row = self._claimed[row_id][0].row
            return (buckets.of_row(row.saga_id, row.source),)

        # Driver errors propagate to the claim, which rolls back and translates them.
        with self._held.get().cursor() as cur:
            if kept:
                cur.executemany(
                    self._keep if buckets is None else self._keep_b,
                    [
                        (
                            *self._columns(i),
                            self._claimed[i][0].attempts + bool(reason),
                            reason,
                            *bucket(i),
                        )
                        for i, reason in kept.items()
                    ],
                )
            if set_aside:
                cur.executemany(
                    self._move if buckets is None else self._move_b,
                    [
                        (*self._columns(s.id), s.reason, s.attempts, s.held_behind, *bucket(s.id))
                        for s in set_aside
                    ],
                )

    def _columns(self, row_id: int) -> tuple[object, ...]:
        entry, created_at = self._claimed[row_id]
        r = entry.row
        headers = Jsonb(dict(r.headers))
        return (
            row_id,
            r.saga_type,
            r.saga_id,
            r.topic,
            r.partition,
            r.key,
            headers,
            r.value,
            created_at,
            r.source[0] if r.source is not None else None,
            r.source[1] if r.source is not None else None,
        )

    def close(self) -> None:
        """Closes the connection; a later claim would open a new one."""
        self._held.close()


def relay_lock_key(tables: Tables) -> str:
    """The advisory lock of the one relay publishing rows of no partition (and of operators)."""
    return f"saga-relay:{tables.schema}"


def partition_lock_key(tables: Tables) -> str:
    """Held shared by partition claims, exclusively by operators moving failed rows."""
    return f"saga-relay-partitions:{tables.schema}"


def _entry(r: Sequence[Any]) -> OutboxEntry:
    source = (r[11], r[12]) if r[11] is not None and r[12] is not None else None
    return OutboxEntry(
        id=r[0],
        row=OutboxRow(
            saga_type=r[1],
            saga_id=r[2],
            topic=r[3],
            key=r[5],
            headers=r[6],
            value=r[7],
            partition=r[4],
            source=source,
        ),
        attempts=r[8],
        behind=r[9],
    )
