"""The raw SQL limit: the same rows as the engine writes, by hand, in the fewest round trips.

Written once here and never through the engine's store, so the ratio shows when the engine's
own statements are the waste. Per batch, in one transaction on one connection:

All arrays travel in binary (``%b``): in text they cost the client ~4x the CPU.

- round trip 1 (pipelined): the sagas that exist and the message ids already applied;
- round trip 2 (pipelined, ends with COMMIT): one multi-row INSERT (``unnest`` of arrays) each
  for new sagas, history and outbox, an UPDATE of existing sagas when there are any, one upsert
  of deadlines (replace-by-name in one statement), the outbox rows an earlier batch already
  published deleted by id, and the offsets' compare-and-set.

The relay's claim-delete (advisory lock + ``DELETE ... RETURNING`` of the oldest rows) is one
more pipelined round trip. Only the table names come from the processor (``Tables``); the tables
and their indexes are the ones ``ensure_schema`` creates.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from benchmarks.boxcpu import Meter, Usage
from processor._postgres.schema.tables import Tables

SAGA_TYPE = "transfer-saga"
EVENT_TYPE = "transfers.TransferRequested"
COMMAND_TYPE = "transfers.DebitAccount"
COMMAND_TOPIC = "account-commands"
DEADLINE = "payment-timeout"
TIMEOUT = timedelta(minutes=30)


@dataclass
class Batch:
    """One batch in columns: what a hand-written loop makes of N TransferRequested events."""

    saga_ids: list[str] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)
    header_lists: list[list[tuple[str, bytes]]] = field(default_factory=list)

    def add(
        self,
        saga_id: str,
        message_id: str,
        body: dict[str, Any],
        partition: int,
        offset: int,
        now: str,
    ) -> None:
        """One event: its new state, its history row, its command and its deadline."""
        self.saga_ids.append(saga_id)
        self.message_ids.append(message_id)
        self.states.append(
            json.dumps(
                {
                    "transfer_id": saga_id,
                    "source_account_id": body["source_account_id"],
                    "target_account_id": body["target_account_id"],
                    "amount": body["amount"],
                    "debit_confirmed": False,
                    "credit_confirmed": False,
                }
            )
        )
        self.partitions.append(partition)
        self.offsets.append(offset)
        self.keys.append(saga_id.encode())
        headers = {
            "message-id": str(uuid.uuid4()),
            "message-type": COMMAND_TYPE,
            "schema-version": "1",
            "correlation-id": saga_id,
            "causation-id": message_id,
            "occurred-at": now,
            "saga-type": SAGA_TYPE,
            "saga-id": saga_id,
        }
        self.headers.append(json.dumps(headers))
        self.header_lists.append([(k, v.encode()) for k, v in headers.items()])
        self.values.append(
            json.dumps(
                {
                    "transfer_id": saga_id,
                    "account_id": body["source_account_id"],
                    "amount": body["amount"],
                }
            ).encode()
        )

    def __len__(self) -> int:
        return len(self.saga_ids)


class OffsetConflict(RuntimeError):
    """The offsets' compare-and-set matched fewer rows than expected: another owner moved on."""


class RawStore:
    """Hand-written SQL over the processor's tables, one connection, pipelined statements."""

    def __init__(self, url: str, tables: Tables, group: str) -> None:
        self.conn = psycopg.connect(url, autocommit=False)
        self.group = group
        r = tables.render
        self._lock_key = f"saga-relay:{tables.schema}"
        self._sagas = r(
            "SELECT saga_id, version FROM {instance}"
            " WHERE saga_type = %s AND saga_id = ANY(%b::text[])"
        )
        # One index probe per pair: a LATERAL subquery behind OFFSET 0 (so the planner cannot
        # turn it into a join) looks each up by the whole unique key. Two ANY lists search the
        # index by saga_type alone and filter every applied row of the type; a plain join, while
        # the statistics of a freshly filled table still say "empty", is planned as a hash or a
        # loop over the whole history. Either makes each batch cost O(history).
        self._applied = r(
            "SELECT u.i, u.m FROM unnest(%b::text[], %b::text[]) AS u(i, m) CROSS JOIN LATERAL"
            " (SELECT 1 FROM {history} AS h WHERE h.saga_type = %s AND h.saga_id = u.i"
            " AND h.message_id = u.m AND h.outcome = 'applied' OFFSET 0) AS found"
        )
        self._insert_sagas = r(
            "INSERT INTO {instance} (saga_type, saga_id, state, status, version)"
            " SELECT %s, i, s::jsonb, 'active', 1 FROM unnest(%b::text[], %b::text[]) AS u(i, s)"
        )
        self._update_sagas = r(
            "UPDATE {instance} AS x SET state = u.s::jsonb, version = u.v + 1,"
            " updated_at = now() FROM unnest(%b::text[], %b::text[], %b::bigint[]) AS u(i, s, v)"
            " WHERE x.saga_type = %s AND x.saga_id = u.i AND x.version = u.v"
        )
        self._history = r(
            "INSERT INTO {history} (saga_type, saga_id, message_id, message_type, kind, outcome,"
            ' version, topic, partition, "offset", detail)'
            " SELECT %s, i, m, %s, 'event', 'applied', 1, %s, p, o, 'on_requested'"
            " FROM unnest(%b::text[], %b::text[], %b::int[], %b::bigint[]) AS u(i, m, p, o)"
        )
        self._outbox = r(
            "INSERT INTO {outbox} (saga_type, saga_id, topic, key, headers, value)"
            " SELECT %s, i, %s, k, h::jsonb, v"
            " FROM unnest(%b::text[], %b::bytea[], %b::text[], %b::bytea[]) AS u(i, k, h, v)"
            " RETURNING id"
        )
        self._deadlines = r(
            "INSERT INTO {deadline} (id, saga_type, saga_id, name, due_at, topic, partition)"
            " SELECT gen_random_uuid(), %s, i, %s, %s, %s, p"
            " FROM unnest(%b::text[], %b::int[]) AS u(i, p)"
            " ON CONFLICT (saga_type, saga_id, name) DO UPDATE SET id = excluded.id,"
            " due_at = excluded.due_at, topic = excluded.topic, partition = excluded.partition,"
            " payload = NULL, dispatched_at = NULL, dispatch_token = NULL"
        )
        self._forget = r("DELETE FROM {outbox} WHERE id = ANY(%b::bigint[])")
        # A short count fails the statement (division by zero), so the queued COMMIT rolls
        # back and the check costs no round trip of its own.
        self._cas = r(
            "WITH moved AS (UPDATE {offsets} AS o SET next_offset = u.n, updated_at = now()"
            " FROM unnest(%b::text[], %b::int[], %b::bigint[], %b::bigint[]) AS u(t, p, n, b)"
            " WHERE o.group_id = %s AND o.topic = u.t AND o.partition = u.p"
            " AND o.owner_epoch = %s AND o.next_offset IS NOT DISTINCT FROM u.b RETURNING 1)"
            " SELECT 1 / (CASE WHEN count(*) = %s THEN 1 ELSE 0 END) FROM moved"
        )
        self._own = r(
            "INSERT INTO {offsets} AS o (group_id, topic, partition, next_offset, owner_epoch,"
            " owner) SELECT %s, %s, p, NULL, 1, 'raw' FROM unnest(%b::int[]) AS p"
            " ON CONFLICT (group_id, topic, partition) DO UPDATE"
            " SET owner_epoch = o.owner_epoch + 1, owner = 'raw'"
            " RETURNING partition, owner_epoch, next_offset"
        )
        self._claim = r(
            "DELETE FROM {outbox} WHERE id IN (SELECT id FROM {outbox} ORDER BY id LIMIT %s"
            " FOR UPDATE) RETURNING id, topic, key, headers, value"
        )
        self.epoch = 0

    def own(self, topic: str, partitions: Sequence[int]) -> dict[int, int | None]:
        """Takes the partitions (bumps the epoch); returns each one's next offset."""
        with self.conn.transaction():
            rows = self.conn.execute(self._own, (self.group, topic, list(partitions))).fetchall()
        self.epoch = max(int(r[1]) for r in rows)
        return {int(p): (None if n is None else int(n)) for p, _e, n in rows}

    def write(
        self,
        batch: Batch,
        topic: str,
        moves: dict[int, tuple[int | None, int]],
        forget: Sequence[int] = (),
    ) -> list[int]:
        """Records a batch and its offsets in one transaction, in two round trips.

        ``moves`` maps partition -> (offset before, offset after); ``forget`` are outbox ids
        already published. Returns the new outbox ids. Raises OffsetConflict if any offset moved.
        """
        try:
            return self._write(batch, topic, moves, forget)
        except psycopg.errors.DivisionByZero as e:
            raise OffsetConflict("an offset moved under this owner") from e

    def _write(
        self,
        batch: Batch,
        topic: str,
        moves: dict[int, tuple[int | None, int]],
        forget: Sequence[int],
    ) -> list[int]:
        conn = self.conn
        # Pipeline outside the transaction: BEGIN and COMMIT travel with the statements.
        with conn.pipeline() as pipe, conn.transaction():
            c1 = conn.execute(self._sagas, (SAGA_TYPE, batch.saga_ids))
            c2 = conn.execute(self._applied, (batch.saga_ids, batch.message_ids, SAGA_TYPE))
            pipe.sync()
            found = {sid: int(v) for sid, v in c1.fetchall()}
            applied = set(c2.fetchall())
            fresh: list[int] = []
            known: list[int] = []
            for n, (sid, mid) in enumerate(zip(batch.saga_ids, batch.message_ids, strict=True)):
                if (sid, mid) in applied:
                    continue  # a duplicate: this workload never sends one, a user must check
                (known if sid in found else fresh).append(n)
            take = sorted(fresh + known)
            ids = [batch.saga_ids[n] for n in take]
            if fresh:
                conn.execute(
                    self._insert_sagas,
                    (
                        SAGA_TYPE,
                        [batch.saga_ids[n] for n in fresh],
                        [batch.states[n] for n in fresh],
                    ),
                )
            if known:
                conn.execute(
                    self._update_sagas,
                    (
                        [batch.saga_ids[n] for n in known],
                        [batch.states[n] for n in known],
                        [found[batch.saga_ids[n]] for n in known],
                        SAGA_TYPE,
                    ),
                )
            conn.execute(
                self._history,
                (
                    SAGA_TYPE,
                    EVENT_TYPE,
                    topic,
                    ids,
                    [batch.message_ids[n] for n in take],
                    [batch.partitions[n] for n in take],
                    [batch.offsets[n] for n in take],
                ),
            )
            c3 = conn.execute(
                self._outbox,
                (
                    SAGA_TYPE,
                    COMMAND_TOPIC,
                    ids,
                    [batch.keys[n] for n in take],
                    [batch.headers[n] for n in take],
                    [batch.values[n] for n in take],
                ),
            )
            conn.execute(
                self._deadlines,
                (
                    SAGA_TYPE,
                    DEADLINE,
                    datetime.now(UTC) + TIMEOUT,
                    topic,
                    ids,
                    [batch.partitions[n] for n in take],
                ),
            )
            if forget:
                conn.execute(self._forget, (list(forget),))
            parts = sorted(moves)
            conn.execute(
                self._cas,
                (
                    [topic] * len(parts),
                    parts,
                    [moves[p][1] for p in parts],
                    [moves[p][0] for p in parts],
                    self.group,
                    self.epoch,
                    len(parts),
                ),
            )
        return [int(r[0]) for r in c3.fetchall()]

    def forget(self, ids: Sequence[int]) -> None:
        """Deletes outbox rows whose records were acknowledged."""
        with self.conn.transaction():
            self.conn.execute(self._forget, (list(ids),))

    def claim_delete(self, limit: int) -> list[tuple[Any, ...]]:
        """The relay's claim: the oldest committed outbox rows, deleted and returned."""
        conn = self.conn
        with conn.pipeline(), conn.transaction():
            conn.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s))", (self._lock_key,))
            cur = conn.execute(self._claim, (limit,))
        return cur.fetchall()

    def close(self) -> None:
        self.conn.close()


@dataclass(frozen=True)
class Measured:
    count: int
    seconds: float
    cpu_seconds: float = 0.0
    note: str = ""
    # The whole box's CPU over the same window, when the loop was given a meter.
    box: Usage | None = None

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else float("inf")

    @property
    def cpu_us(self) -> float:
        return self.cpu_seconds / self.count * 1e6 if self.count else 0.0


def sql_loop(
    url: str,
    tables: Tables,
    *,
    events: int,
    batch_size: int,
    partitions: int,
    topic: str,
    progress: Callable[[int], None] = lambda n: None,
    meter: Meter | None = None,
) -> Measured:
    """`events` new sagas in batches, each batch followed by the relay's claim-delete."""
    store = RawStore(url, tables, "bench-raw-sql")
    try:
        positions: dict[int, int | None] = store.own(topic, range(partitions))
        now = datetime.now(UTC).isoformat()
        run = uuid.uuid4().hex[:6]
        batches: list[tuple[Batch, dict[int, tuple[int | None, int]]]] = []
        # Built before the clock starts: this is the limit of the SQL, not of making rows.
        for first in range(0, events, batch_size):
            batch = Batch()
            moves: dict[int, tuple[int | None, int]] = {}
            for n in range(first, min(events, first + batch_size)):
                p = n % partitions
                before = positions[p]
                offset = before or 0
                body = {
                    "source_account_id": "acc-1",
                    "target_account_id": "acc-2",
                    "amount": "10.00",
                }
                batch.add(f"raw-{run}-{n}", str(uuid.uuid4()), body, p, offset, now)
                positions[p] = offset + 1
                moves[p] = (moves[p][0] if p in moves else before, offset + 1)
            batches.append((batch, moves))
        done = 0
        t0, c0 = time.perf_counter(), time.process_time()
        box0 = meter.read() if meter else None
        for batch, moves in batches:
            store.write(batch, topic, moves)
            store.claim_delete(max(1000, batch_size))
            done += len(batch)
            progress(done)
        while store.claim_delete(1000):
            pass
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        box = meter.read().minus(box0) if meter and box0 else None
        return Measured(done, seconds, cpu, box=box)
    finally:
        store.close()
