"""One set of retention cases, run against the in-memory store and the PostgreSQL one.

Both must purge the same rows for each kind: only rows older than the age given, the oldest
first and no more than the limit; an ended saga's history in chunks before its row, which leaves
a tombstone; never a running saga's history nor a parked saga's held messages; and nothing while
another replica's retention holds the lock.

The clocks differ (the memory store's is the test's, PostgreSQL's is the server's), so rows are
made old by moving the clock forward (memory) or their times back (PostgreSQL), by hours.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from typing import Protocol

import pytest

from processor._engine.records import OutboxRow, Record
from processor._engine.rows import (
    ACTIVE,
    ENDED,
    PARKED,
    DeadLetter,
    HistoryRow,
    Outcome,
    ParkedMessage,
    SagaStatus,
    SagaWrite,
    Wants,
    WriteSet,
)
from processor._memory.outbox import MemoryOutboxStore
from processor._memory.retention import MemoryRetentionStore
from processor._memory.store import MemoryBatchStore, MemoryTables
from processor._ports import (
    BatchStore,
    FailedOutboxStore,
    OutboxStore,
    Purge,
    RetentionStore,
    SetAside,
)
from tests.contract import BACKENDS, postgres_args
from tests.support.clocks import Offset, moved_back

SAGA = "retained"
HOUR = timedelta(hours=1)
HALF = timedelta(minutes=30)


class Backend(Protocol):
    store: RetentionStore
    batch: BatchStore
    outbox: OutboxStore
    failed: FailedOutboxStore

    def replica(self) -> RetentionStore:
        """Another replica's retention over the same tables."""
        ...

    def age(self, by: timedelta) -> None:
        """Makes every row stored so far ``by`` older."""
        ...

    def history(self) -> list[tuple[str, str, str]]:
        """(saga id, message id, outcome) of every history row, in the order written."""
        ...

    def dead_letters(self) -> list[int]:
        """The input offsets of the dead letters, in the order written."""
        ...

    def append_outbox(self, rows: list[OutboxRow]) -> list[int]:
        """Commits rows to the outbox, as a batch would; their ids."""
        ...

    def held_elsewhere(self) -> AbstractContextManager[None]:
        """Within the block another replica's retention holds the lock."""
        ...

    def close(self) -> None: ...


class MemoryBackend:
    def __init__(self) -> None:
        self.clock = Offset()
        self.tables = MemoryTables()
        self.batch: BatchStore = MemoryBatchStore(self.tables, clock=self.clock.now)
        self.memory_outbox = MemoryOutboxStore()
        self.outbox: OutboxStore = self.memory_outbox
        self.failed: FailedOutboxStore = self.memory_outbox
        self.memory = MemoryRetentionStore(self.tables, self.memory_outbox, clock=self.clock.now)
        self.store: RetentionStore = self.memory

    def replica(self) -> RetentionStore:
        return self.memory.replica()

    def age(self, by: timedelta) -> None:
        self.memory.observe()
        self.clock.ahead += by

    def history(self) -> list[tuple[str, str, str]]:
        return [(h.saga_id, h.message_id, str(h.outcome)) for h in self.tables.history]

    def dead_letters(self) -> list[int]:
        return [d.record.offset for d in self.tables.dead_letters]

    def append_outbox(self, rows: list[OutboxRow]) -> list[int]:
        return self.memory_outbox.append(rows)

    def held_elsewhere(self) -> AbstractContextManager[None]:
        return self.memory.held_elsewhere()

    def close(self) -> None:
        self.memory.close()


class PostgresBackend:
    def __init__(self, url: str, schema: str) -> None:
        from processor._postgres.batch.handle import PostgresBatchStore
        from processor._postgres.connect import connect, ensure_schema
        from processor._postgres.failed_outbox import PostgresFailedOutbox
        from processor._postgres.outbox import PostgresOutboxStore
        from processor._postgres.schema.tables import Tables

        self.url = url
        self.tables = Tables(schema=schema)
        ensure_schema(url, self.tables)
        self._connect = lambda: connect(url)
        self.admin = connect(url, autocommit=True)
        self.made: list[RetentionStore] = []
        self.store: RetentionStore = self.replica()
        self.batch: BatchStore = PostgresBatchStore(self._connect, self.tables, "retention")
        self.outbox: OutboxStore = PostgresOutboxStore(self._connect, self.tables, None)
        self.failed: FailedOutboxStore = PostgresFailedOutbox(self.admin, self.tables)

    def replica(self) -> RetentionStore:
        from processor._postgres.retention import PostgresRetentionStore

        made = PostgresRetentionStore(self._connect, self.tables)
        self.made.append(made)
        return made

    def age(self, by: timedelta) -> None:
        for table, column in (
            ("instance", "ended_at"),
            ("history", "at"),
            ("dead_letter", "created_at"),
            ("parked", "created_at"),
            ("failed_outbox", "failed_at"),
            ("tombstone", "ended_at"),
        ):
            self.admin.execute(
                self.tables.render(
                    f"UPDATE {{{table}}} SET {column} = {moved_back(column)}"
                    f" WHERE {column} IS NOT NULL"
                ),
                (by,),
            )

    def history(self) -> list[tuple[str, str, str]]:
        rows = self.admin.execute(
            self.tables.render("SELECT saga_id, message_id, outcome FROM {history} ORDER BY id")
        ).fetchall()
        return [(str(s), str(m), str(o)) for s, m, o in rows]

    def dead_letters(self) -> list[int]:
        rows = self.admin.execute(
            self.tables.render('SELECT "offset" FROM {dead_letter} ORDER BY id')
        ).fetchall()
        return [int(o) for (o,) in rows]

    def append_outbox(self, rows: list[OutboxRow]) -> list[int]:
        self.batch.write(WriteSet(outbox=rows), [])
        found = self.admin.execute(
            self.tables.render("SELECT id FROM {outbox} ORDER BY id DESC LIMIT %s"), (len(rows),)
        ).fetchall()
        return sorted(int(i) for (i,) in found)

    @contextmanager
    def held_elsewhere(self) -> Iterator[None]:
        from processor._postgres.connect import connect

        with connect(self.url) as other, other.transaction():
            other.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))",
                (f"saga-retention:{self.tables.schema}",),
            )
            yield

    def close(self) -> None:
        for store in self.made:
            store.close()
        self.batch.close()
        self.outbox.close()
        self.admin.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    args = postgres_args(request)
    made: Backend = MemoryBackend() if args is None else PostgresBackend(*args)
    try:
        yield made
    finally:
        made.close()


# -- writing rows as batches do ------------------------------------------------------------------


def saga(sid: str, version: int, expected: int | None, status: SagaStatus = ACTIVE) -> SagaWrite:
    reason = "boom" if status == PARKED else None
    return SagaWrite(SAGA, sid, {"id": sid}, status, version, expected, reason)


def seen(sid: str, mid: str, outcome: Outcome = Outcome.APPLIED) -> HistoryRow:
    version = 1 if outcome is Outcome.APPLIED else None
    return HistoryRow(SAGA, sid, mid, "Ev", "event", outcome, version, "in", 0, 0)


def record(offset: int, key: bytes = b"k") -> Record:
    return Record("in", 0, offset, key, b"{}", (("message-id", f"m-{offset}".encode()),))


def history_of(backend: Backend, sid: str) -> list[str]:
    return [m for s, m, _ in backend.history() if s == sid]


def applied_of(backend: Backend, sid: str, *mids: str) -> set[str]:
    loaded = backend.batch.load(Wants(set(), {(SAGA, sid, m) for m in mids}, set()))
    return {m for _, _, m in loaded.applied}


# -- ended sagas -----------------------------------------------------------------------------------


def test_an_ended_sagas_history_goes_in_chunks_then_its_row_for_a_tombstone(
    backend: Backend,
) -> None:
    mids = [f"m{i:02}" for i in range(12)]
    backend.batch.write(
        WriteSet(
            sagas=[saga("done", 1, None), saga("running", 1, None)],
            history=[seen("done", m) for m in mids] + [seen("running", "r1")],
        ),
        [],
    )
    backend.batch.write(WriteSet(sagas=[saga("done", 2, 1, ENDED)]), [])
    backend.age(2 * HOUR)
    store = backend.store

    # Too young for three hours; and the saga's row waits while more than a few rows are left.
    assert store.purge(Purge.ENDED_HISTORY, 3 * HOUR, 100) == 0
    assert store.purge(Purge.ENDED_SAGAS, HOUR, 10) == 0
    assert store.purge(Purge.ENDED_HISTORY, HOUR, 5) == 5
    assert len(history_of(backend, "done")) == 7
    assert store.purge(Purge.ENDED_SAGAS, HOUR, 10) == 1

    loaded = backend.batch.load(Wants({(SAGA, "done"), (SAGA, "running")}, set(), set()))
    assert set(loaded.sagas) == {(SAGA, "running")}
    assert set(loaded.tombstones) == {(SAGA, "done")}
    assert history_of(backend, "done") == []
    assert history_of(backend, "running") == ["r1"]
    assert applied_of(backend, "done", *mids) == set()
    assert applied_of(backend, "running", "r1") == {"r1"}
    assert store.purge(Purge.ENDED_SAGAS, HOUR, 10) == 0
    assert store.purge(Purge.ENDED_HISTORY, HOUR, 10) == 0


def test_ended_sagas_go_oldest_first_and_no_more_than_the_limit(backend: Backend) -> None:
    for i, sid in enumerate(["first", "second", "third"]):
        backend.batch.write(WriteSet(sagas=[saga(sid, 1, None, ENDED)]), [])
        backend.age(HOUR * (3 - i))
    # Ended 6, 3 and 1 hours ago.
    store = backend.store
    assert store.purge(Purge.ENDED_SAGAS, HALF, 1) == 1
    keys = {(SAGA, s) for s in ("first", "second", "third")}
    assert set(backend.batch.load(Wants(keys, set(), set())).tombstones) == {(SAGA, "first")}
    assert store.purge(Purge.ENDED_SAGAS, 2 * HOUR, 10) == 1
    assert store.purge(Purge.ENDED_SAGAS, HALF, 10) == 1
    assert set(backend.batch.load(Wants(keys, set(), set())).tombstones) == keys


def test_tombstones_go_by_their_sagas_end_past_the_window(backend: Backend) -> None:
    backend.batch.write(WriteSet(sagas=[saga("old", 1, None, ENDED)]), [])
    backend.age(HOUR)
    backend.batch.write(WriteSet(sagas=[saga("new", 1, None, ENDED)]), [])
    backend.age(HOUR)
    store = backend.store
    assert store.purge(Purge.ENDED_SAGAS, HALF, 10) == 2
    keys = {(SAGA, "old"), (SAGA, "new")}

    assert store.purge(Purge.TOMBSTONES, 3 * HOUR, 10) == 0
    assert store.purge(Purge.TOMBSTONES, 90 * timedelta(minutes=1), 10) == 1
    assert set(backend.batch.load(Wants(keys, set(), set())).tombstones) == {(SAGA, "new")}
    assert store.purge(Purge.TOMBSTONES, HALF, 10) == 1
    loaded = backend.batch.load(Wants(keys, set(), set()))
    assert (set(loaded.tombstones), set(loaded.sagas)) == (set(), set())


# -- history past the windows ----------------------------------------------------------------------


def test_history_purges_keep_a_running_sagas_rows_and_applied_ids_until_their_window(
    backend: Backend,
) -> None:
    backend.batch.write(
        WriteSet(
            sagas=[saga("running", 1, None)],
            # "gone" has no saga row (its saga was purged, or never started).
            history=[
                seen("running", "r1"),
                seen("running", "r2", Outcome.DUPLICATE),
                seen("gone", "g1"),
                seen("gone", "g2", Outcome.DUPLICATE),
                seen("gone", "g3", Outcome.DUPLICATE),
            ],
        ),
        [],
    )
    backend.age(2 * HOUR)
    backend.batch.write(WriteSet(history=[seen("young", "y1", Outcome.DUPLICATE)]), [])
    store = backend.store

    assert store.purge(Purge.HISTORY, HOUR, 1) == 1
    assert store.purge(Purge.HISTORY, HOUR, 100) == 1
    assert backend.history() == [
        ("running", "r1", "applied"),
        ("running", "r2", "duplicate"),
        ("gone", "g1", "applied"),
        ("young", "y1", "duplicate"),
    ]
    assert applied_of(backend, "gone", "g1") == {"g1"}

    assert store.purge(Purge.APPLIED, 3 * HOUR, 100) == 0
    assert store.purge(Purge.APPLIED, HOUR, 100) == 1
    assert [m for _, m, _ in backend.history()] == ["r1", "r2", "y1"]
    assert applied_of(backend, "gone", "g1") == set()
    assert applied_of(backend, "running", "r1") == {"r1"}


# -- dead letters, held messages, failed outbox rows -----------------------------------------------


def test_dead_letters_go_oldest_first_in_chunks(backend: Backend) -> None:
    for offset in (1, 2, 3):
        backend.batch.write(WriteSet(dead_letters=[DeadLetter(record(offset), "bad", "")]), [])
        backend.age(HOUR)
    backend.batch.write(WriteSet(dead_letters=[DeadLetter(record(4), "bad", "")]), [])
    store = backend.store

    assert store.purge(Purge.DEAD_LETTERS, HALF, 1) == 1
    assert backend.dead_letters() == [2, 3, 4]
    assert store.purge(Purge.DEAD_LETTERS, 90 * timedelta(minutes=1), 10) == 1
    assert backend.dead_letters() == [3, 4]
    assert store.purge(Purge.DEAD_LETTERS, HALF, 10) == 1
    assert backend.dead_letters() == [4]


def test_a_parked_sagas_held_messages_stay_however_old(backend: Backend) -> None:
    backend.batch.write(
        WriteSet(
            sagas=[saga("parked", 1, None, PARKED), saga("resolved", 1, None)],
            parked=[
                ParkedMessage(SAGA, "parked", record(1), "boom"),
                ParkedMessage(SAGA, "resolved", record(2), "boom"),
                ParkedMessage(SAGA, "parked", record(3), "behind"),
                ParkedMessage(SAGA, "resolved", record(4), "behind"),
                ParkedMessage(SAGA, "absent", record(5), "behind"),
            ],
        ),
        [],
    )
    backend.age(2 * HOUR)
    backend.batch.write(WriteSet(parked=[ParkedMessage(SAGA, "resolved", record(6), "x")]), [])
    store = backend.store

    assert store.purge(Purge.PARKED, HOUR, 2) == 2
    assert store.purge(Purge.PARKED, HOUR, 10) == 1
    keys = {(SAGA, s) for s in ("parked", "resolved", "absent")}
    held = backend.batch.load(Wants(set(), set(), set(), keys)).held
    assert {k[1]: [h.record.offset for h in v] for k, v in held.items()} == {
        "parked": [1, 3],
        "resolved": [6],
    }


def test_failed_outbox_rows_go_by_when_they_were_set_aside(backend: Backend) -> None:
    rows = [
        OutboxRow(SAGA, sid, "commands", None, {"message-id": sid}, b"v") for sid in ("a", "b", "c")
    ]
    ids = backend.append_outbox(rows)
    for row_id in ids:
        with backend.outbox.claim(1) as claimed:
            assert claimed is not None
            assert [e.id for e in claimed] == [row_id]
            backend.outbox.settle([SetAside(row_id, "too large", 1)], {})
        backend.age(HOUR)
    # Set aside 3, 2 and 1 hours ago.
    store = backend.store

    assert store.purge(Purge.FAILED_OUTBOX, 4 * HOUR, 10) == 0
    assert store.purge(Purge.FAILED_OUTBOX, HALF, 1) == 1
    assert [f.id for f in backend.failed.list_failed()] == ids[1:]
    assert store.purge(Purge.FAILED_OUTBOX, 90 * timedelta(minutes=1), 10) == 1
    assert [f.id for f in backend.failed.list_failed()] == ids[2:]


# -- one replica at a time ---------------------------------------------------------------------


def test_a_purge_while_another_replica_holds_the_lock_does_nothing(backend: Backend) -> None:
    backend.batch.write(WriteSet(dead_letters=[DeadLetter(record(1), "bad", "")]), [])
    backend.age(HOUR)
    other = backend.replica()

    with backend.held_elsewhere():
        assert backend.store.purge(Purge.DEAD_LETTERS, HALF, 10) is None
        assert other.purge(Purge.DEAD_LETTERS, HALF, 10) is None
        assert backend.dead_letters() == [1]
    assert other.purge(Purge.DEAD_LETTERS, HALF, 10) == 1
    assert backend.dead_letters() == []
    assert backend.store.purge(Purge.DEAD_LETTERS, HALF, 10) == 0
