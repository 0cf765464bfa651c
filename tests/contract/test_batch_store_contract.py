"""One set of batch store cases, run against the in-memory store and the PostgreSQL one.

Both must give the same results: claims bump epochs, a write is a compare-and-set on epochs,
positions and saga versions that leaves nothing behind when refused (fencing checked first),
applied message ids and deadlines are read back as written, and a lost connection is
``Retryable`` once, after which the store reconnects by itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from processor._engine.records import OffsetCommit, OutboxRow, Record
from processor._engine.rows import (
    ACTIVE,
    DECIDED,
    ENDED,
    AuditEntry,
    DeadlineInsert,
    DeadlineRef,
    HistoryRow,
    Outcome,
    ParkedMessage,
    SagaRow,
    SagaWrite,
    Wants,
    WriteSet,
)
from processor._errors import (
    CommitInDoubt,
    ConcurrentUpdate,
    FencedOut,
    RecordDataError,
    Retryable,
)
from processor._memory.store import MemoryBatchStore, MemoryTables
from processor._ports import TP, BatchStore, Purge
from processor._ports.views import AuditRow
from tests.contract import BACKENDS

SAGA = "contract-saga"
A: TP = ("contract-in", 0)
B: TP = ("contract-in", 1)
C: TP = ("contract-in", 2)
DUE = datetime(2031, 5, 1, 9, 30, 15, 250_000, tzinfo=UTC)


@dataclass
class Backing:
    """One backing store, seen through as many handles (replicas, connections) as a case needs.

    Attributes:
        store: Opens another handle on the same data.
        outbox: How many outbox rows are stored.
        kill: Ends the server side of every open handle's connection, as an administrator or a
            failover would; None where there is no connection to lose.
        purge_ended: Purges every ended saga as retention does once its period has passed.
    """

    store: Callable[[], BatchStore]
    outbox: Callable[[], int]
    kill: Callable[[], None] | None = None
    purge_ended: Callable[[], None] | None = None
    # The audit trail's entries, newest first.
    audit: Callable[[], list[AuditRow]] = list


def _memory() -> Iterator[Backing]:
    tables = MemoryTables()

    def purge_ended() -> None:
        MemoryBatchStore(tables).purge_ended()

    yield Backing(
        lambda: MemoryBatchStore(tables),
        lambda: len(tables.outbox),
        purge_ended=purge_ended,
        audit=tables.audit.audit,
    )


def _postgres(request: pytest.FixtureRequest) -> Iterator[Backing]:
    from processor._postgres.batch.handle import PostgresBatchStore
    from processor._postgres.connect import connect, ensure_schema
    from processor._postgres.retention import PostgresRetentionStore
    from processor._postgres.schema.tables import Tables

    database_url: str = request.getfixturevalue("database_url")
    tables = Tables(schema=request.getfixturevalue("pg_schema"))
    ensure_schema(database_url, tables)
    # Names this test's connections, so `kill` ends them and no one else's.
    app = f"contract-{uuid.uuid4().hex[:12]}"
    opened: list[BatchStore] = []

    with connect(database_url, autocommit=True) as admin:

        def store() -> BatchStore:
            handle = PostgresBatchStore(
                lambda: connect(database_url, application_name=app), tables, "contract-group"
            )
            opened.append(handle)
            return handle

        def outbox() -> int:
            row = admin.execute(tables.render("SELECT count(*) FROM {outbox}")).fetchone()
            assert row is not None
            return int(row[0])

        def kill() -> None:
            ended = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (app,),
            ).fetchall()
            assert ended, "no connection to end"

        def purge_ended() -> None:
            retention = PostgresRetentionStore(lambda: connect(database_url), tables)
            try:
                retention.purge(Purge.ENDED_SAGAS, timedelta(0), 1000)
            finally:
                retention.close()

        def audit() -> list[AuditRow]:
            from processor._postgres.reads.inspect import InspectQueries

            return InspectQueries(admin, tables).audit()

        try:
            yield Backing(store, outbox, kill, purge_ended, audit)
        finally:
            for s in opened:
                s.close()


@pytest.fixture(params=BACKENDS)
def backing(request: pytest.FixtureRequest) -> Iterator[Backing]:
    if request.param == "memory":
        yield from _memory()
    else:
        yield from _postgres(request)


# -- building batches ----------------------------------------------------------------------------


def saga(sid: str, version: int, expected: int | None, **state: Any) -> SagaWrite:
    status = ENDED if state.pop("ended", False) else ACTIVE
    return SagaWrite(SAGA, sid, {"id": sid, **state}, status, version, expected, None)


def applied(sid: str, mid: str, version: int = 1, offset: int = 0) -> HistoryRow:
    return HistoryRow(SAGA, sid, mid, "Ev", "event", Outcome.APPLIED, version, A[0], A[1], offset)


def command(sid: str, n: int) -> OutboxRow:
    return OutboxRow(SAGA, sid, "commands", sid.encode(), {"message-id": f"{sid}-{n}"}, b"{}")


def deadline(sid: str, name: str, payload: Any = None) -> DeadlineInsert:
    return DeadlineInsert(str(uuid.uuid4()), SAGA, sid, name, DUE, payload, A[0], A[1])


def at(tp: TP, next_offset: int, expected: int | None, epoch: int) -> OffsetCommit:
    return OffsetCommit(tp[0], tp[1], next_offset, expected, epoch)


def started(sid: str, mid: str, offset: int) -> WriteSet:
    """What a batch that starts saga ``sid`` with message ``mid`` writes."""
    return WriteSet(
        sagas=[saga(sid, 1, None, step=1)],
        history=[applied(sid, mid, 1, offset)],
        outbox=[command(sid, 1)],
        deadline_inserts=[deadline(sid, "timeout")],
    )


def sagas_of(store: BatchStore, *sids: str) -> dict[str, tuple[Any, ...]]:
    loaded = store.load(Wants({(SAGA, s) for s in sids}, set(), set()))
    return {i: (r.status, r.version, r.state) for (_, i), r in loaded.sagas.items()}


def applied_of(store: BatchStore, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str, str]]:
    return set(store.load(Wants(set(), {(SAGA, s, m) for s, m in keys}, set())).applied)


def deadlines_of(store: BatchStore, ids: Sequence[str]) -> dict[str, DeadlineRef]:
    return dict(store.load(Wants(set(), set(), set(ids))).deadlines)


# -- claims and offsets --------------------------------------------------------------------------


def test_claim_bumps_epochs_and_returns_the_stored_positions(backing: Backing) -> None:
    first, second = backing.store(), backing.store()

    assert first.claim([A, B], "one") == {A: (1, None), B: (1, None)}
    first.write(WriteSet(), [at(A, 5, None, 1)])
    assert second.claim([A, C], "two") == {A: (2, 5), C: (1, None)}

    expected = {A: (2, 5), B: (1, None), C: (1, None)}
    assert first.read_offsets([A, B, C]) == expected
    assert second.read_offsets([A, B, C, ("contract-in", 9)]) == expected
    assert first.read_offsets([]) == {}


def test_offsets_advance_only_from_the_expected_position(backing: Backing) -> None:
    store = backing.store()
    store.claim([A], "one")
    store.write(WriteSet(), [at(A, 3, None, 1)])
    store.write(WriteSet(), [at(A, 7, 3, 1)])

    with pytest.raises(FencedOut) as refused:
        store.write(started("s1", "m1", 5), [at(A, 8, 5, 1)])

    assert refused.value.partitions == [A]
    assert store.read_offsets([A]) == {A: (1, 7)}
    assert sagas_of(store, "s1") == {}


def test_a_stale_epoch_is_fenced_out_and_writes_nothing(backing: Backing) -> None:
    zombie, owner = backing.store(), backing.store()
    zombie.claim([A, B], "zombie")
    owner.claim([A], "owner")

    stale = started("s1", "m1", 0)
    with pytest.raises(FencedOut) as refused:
        zombie.write(stale, [at(A, 1, None, 1), at(B, 1, None, 1)])

    assert refused.value.partitions == [A]
    assert owner.read_offsets([A, B]) == {A: (2, None), B: (1, None)}
    assert sagas_of(owner, "s1") == {}
    assert applied_of(owner, [("s1", "m1")]) == set()
    assert backing.outbox() == 0
    assert deadlines_of(owner, [d.id for d in stale.deadline_inserts]) == {}


def test_an_unclaimed_partition_is_fenced_out(backing: Backing) -> None:
    store = backing.store()
    with pytest.raises(FencedOut) as refused:
        store.write(WriteSet(), [at(C, 1, None, 1)])
    assert refused.value.partitions == [C]
    assert store.read_offsets([C]) == {}


def test_fencing_is_checked_before_the_saga_rows(backing: Backing) -> None:
    zombie, owner = backing.store(), backing.store()
    zombie.claim([A], "zombie")
    owner.claim([A], "owner")
    owner.write(started("s1", "m1", 0), [at(A, 1, None, 2)])

    # The zombie re-plans the same record: its insert of s1 would clash with the stored row,
    # but it must be refused for what it is, a stale owner, not for bad data.
    with pytest.raises(FencedOut):
        zombie.write(started("s1", "m1", 0), [at(A, 1, None, 1)])

    assert owner.read_offsets([A]) == {A: (2, 1)}
    assert sagas_of(owner, "s1") == {"s1": (ACTIVE, 1, {"id": "s1", "step": 1})}
    assert backing.outbox() == 1


def test_a_fenced_batch_that_replaces_deadlines_writes_nothing(backing: Backing) -> None:
    # Deletes of deadline rows must precede the inserts of their successors, so such a batch
    # is fenced by a statement of its own; the outcome is the same.
    zombie, owner = backing.store(), backing.store()
    zombie.claim([A], "zombie")
    first = started("s1", "m1", 0)
    zombie.write(first, [at(A, 1, None, 1)])
    owner.claim([A], "owner")

    again = deadline("s1", "timeout")
    stale = WriteSet(
        sagas=[saga("s1", 2, 1, step=2)],
        history=[applied("s1", "m2", 2, 1)],
        outbox=[command("s1", 2)],
        deadline_deletes=[(SAGA, "s1", "timeout")],
        deadline_inserts=[again],
    )
    with pytest.raises(FencedOut) as refused:
        zombie.write(stale, [at(A, 2, 1, 1)])

    assert refused.value.partitions == [A]
    assert owner.read_offsets([A]) == {A: (2, 1)}
    assert sagas_of(owner, "s1") == {"s1": (ACTIVE, 1, {"id": "s1", "step": 1})}
    assert applied_of(owner, [("s1", "m2")]) == set()
    assert backing.outbox() == 1
    assert list(deadlines_of(owner, [first.deadline_inserts[0].id, again.id])) == [
        first.deadline_inserts[0].id
    ]


# -- saga rows -----------------------------------------------------------------------------------


def test_a_moved_saga_version_is_a_concurrent_update_and_writes_nothing(
    backing: Backing,
) -> None:
    store = backing.store()
    store.claim([A], "one")
    store.write(started("s1", "m1", 0), [at(A, 1, None, 1)])
    store.write(WriteSet(sagas=[saga("s1", 2, 1, step=2)]), [])

    late = WriteSet(
        sagas=[saga("s1", 2, 1, step=99)],
        history=[applied("s1", "m2", 2, 1)],
        outbox=[command("s1", 2)],
    )
    with pytest.raises(ConcurrentUpdate):
        store.write(late, [at(A, 2, 1, 1)])

    assert sagas_of(store, "s1") == {"s1": (ACTIVE, 2, {"id": "s1", "step": 2})}
    assert store.read_offsets([A]) == {A: (1, 1)}
    assert applied_of(store, [("s1", "m2")]) == set()
    assert backing.outbox() == 1


def test_an_update_of_a_missing_saga_is_a_concurrent_update(backing: Backing) -> None:
    store = backing.store()
    with pytest.raises(ConcurrentUpdate):
        store.write(WriteSet(sagas=[saga("gone", 3, 2)]), [])
    assert sagas_of(store, "gone") == {}


def test_inserting_a_saga_that_exists_is_refused_data(backing: Backing) -> None:
    store = backing.store()
    store.write(WriteSet(sagas=[saga("s1", 1, None)]), [])
    with pytest.raises(RecordDataError) as refused:
        store.write(WriteSet(sagas=[saga("s1", 1, None, step=5)]), [])
    assert refused.value.sqlstate == "23505"
    assert sagas_of(store, "s1") == {"s1": (ACTIVE, 1, {"id": "s1"})}


def test_saga_rows_are_loaded_back_as_written(backing: Backing) -> None:
    store = backing.store()
    store.write(WriteSet(sagas=[saga("s1", 1, None, n=[1, "x"]), saga("s2", 4, None)]), [])
    store.write(WriteSet(sagas=[saga("s2", 5, 4, ended=True)]), [])

    loaded = store.load(Wants({(SAGA, "s1"), (SAGA, "s2"), (SAGA, "none")}, set(), set()))

    assert dict(loaded.sagas) == {
        (SAGA, "s1"): SagaRow(SAGA, "s1", {"id": "s1", "n": [1, "x"]}, ACTIVE, 1),
        (SAGA, "s2"): SagaRow(SAGA, "s2", {"id": "s2"}, ENDED, 5),
    }
    assert loaded.now.tzinfo is not None


def test_text_that_json_escapes_is_stored_and_loaded_exactly(backing: Backing) -> None:
    # The PostgreSQL store sends a batch's rows as JSON: quotes, backslashes, control and
    # non-BMP characters must come back as they went in, in keys, states and deadline names.
    odd = 'q"b\\s\nn\tt\u2028l\U0001f600e{}[],'
    store = backing.store()
    row = deadline(odd, odd, payload={"p": odd})
    store.write(
        WriteSet(
            sagas=[saga(odd, 1, None, text=odd)],
            history=[applied(odd, odd)],
            deadline_inserts=[row],
        ),
        [],
    )
    store.write(WriteSet(sagas=[saga(odd, 2, 1, text=odd + odd)]), [])

    assert sagas_of(store, odd) == {odd: (ACTIVE, 2, {"id": odd, "text": odd + odd})}
    assert applied_of(store, [(odd, odd)]) == {(SAGA, odd, odd)}
    assert deadlines_of(store, [row.id]) == {
        row.id: DeadlineRef(SAGA, odd, odd, DUE, {"p": odd}, None)
    }
    store.write(WriteSet(deadline_deletes=[(SAGA, odd, odd)]), [])
    assert deadlines_of(store, [row.id]) == {}


# -- applied message ids -------------------------------------------------------------------------


def test_applied_message_ids_are_loaded_back(backing: Backing) -> None:
    store = backing.store()
    dup = HistoryRow(SAGA, "s1", "m2", "Ev", "event", Outcome.DUPLICATE, None, A[0], A[1], 1)
    store.write(WriteSet(history=[applied("s1", "m1"), dup, applied("s2", "m1")]), [])

    found = applied_of(store, [("s1", "m1"), ("s1", "m2"), ("s2", "m1"), ("s3", "m1")])

    assert found == {(SAGA, "s1", "m1"), (SAGA, "s2", "m1")}
    assert applied_of(store, []) == set()


def test_a_second_applied_row_for_a_message_is_refused(backing: Backing) -> None:
    store = backing.store()
    store.claim([A], "one")
    store.write(WriteSet(history=[applied("s1", "m1")]), [at(A, 1, None, 1)])

    with pytest.raises(RecordDataError) as refused:
        store.write(
            WriteSet(history=[applied("s1", "m1", 2, 1)], outbox=[command("s1", 1)]),
            [at(A, 2, 1, 1)],
        )

    assert refused.value.sqlstate == "23505"
    assert store.read_offsets([A]) == {A: (1, 1)}
    assert backing.outbox() == 0


@pytest.mark.parametrize(
    ("outcome", "decided"),
    [
        (Outcome.APPLIED, True),
        (Outcome.NO_SAGA, True),
        (Outcome.IGNORED_ENDED, True),
        (Outcome.OPERATOR_REFUSED, True),
        (Outcome.SKIPPED, True),
        # Held behind a parked saga: a retry replays it, so it is not decided yet.
        (Outcome.PARKED_BEHIND, False),
        (Outcome.PARKED, False),
        (Outcome.DUPLICATE, False),
    ],
)
def test_an_operator_record_is_decided_by_any_outcome_but_being_held(
    backing: Backing, outcome: Outcome, decided: bool
) -> None:
    store = backing.store()
    row = HistoryRow(
        SAGA, "s1", "operator:c1", "operator:cancel", "operator", outcome, None, A[0], A[1], 1
    )
    store.write(WriteSet(history=[row]), [])
    asked = {(SAGA, "s1", "operator:c1"), (SAGA, "s2", "operator:c1")}

    loaded = store.load(Wants({(SAGA, "s1")}, set(), set(), operator_keys=asked))

    assert set(loaded.decided) == ({(SAGA, "s1", "operator:c1")} if decided else set())
    assert (outcome in DECIDED) is decided
    # Asked about none, none is read: a batch of events never pays for it.
    assert not store.load(Wants({(SAGA, "s1")}, {(SAGA, "s1", "operator:c1")}, set())).decided


# -- deadlines -----------------------------------------------------------------------------------


def test_deadlines_are_inserted_deleted_and_cleared_as_the_batch_says(backing: Backing) -> None:
    store = backing.store()
    a1 = deadline("s1", "a", {"k": [1, 2]})
    b1 = deadline("s1", "b")
    a2 = deadline("s2", "a", "text")
    c2 = deadline("s2", "c")
    store.write(WriteSet(deadline_inserts=[a1, b1, a2, c2]), [])

    ids = [a1.id, b1.id, a2.id, c2.id]
    loaded = store.load(Wants(set(), set(), set(ids)))
    assert dict(loaded.deadlines) == {
        a1.id: DeadlineRef(SAGA, "s1", "a", DUE, {"k": [1, 2]}, None),
        b1.id: DeadlineRef(SAGA, "s1", "b", DUE, None, None),
        a2.id: DeadlineRef(SAGA, "s2", "a", DUE, "text", None),
        c2.id: DeadlineRef(SAGA, "s2", "c", DUE, None, None),
    }
    assert loaded.lease_token is None

    # Rescheduling s1's "a" (delete, then insert under the same name) and clearing all of s2's.
    again = deadline("s1", "a", 7)
    store.write(
        WriteSet(
            deadline_deletes=[(SAGA, "s1", "a")],
            deadline_clears=[(SAGA, "s2")],
            deadline_inserts=[again],
        ),
        [],
    )

    assert deadlines_of(store, [*ids, again.id]) == {
        b1.id: DeadlineRef(SAGA, "s1", "b", DUE, None, None),
        again.id: DeadlineRef(SAGA, "s1", "a", DUE, 7, None),
    }


def test_deadline_ids_compare_as_uuids(backing: Backing) -> None:
    store = backing.store()
    d = deadline("s1", "a")
    store.write(WriteSet(deadline_inserts=[d]), [])
    assert list(deadlines_of(store, [d.id.upper()])) == [d.id]


def test_scheduling_a_deadline_name_already_pending_is_refused(backing: Backing) -> None:
    store = backing.store()
    first = deadline("s1", "a")
    store.write(WriteSet(deadline_inserts=[first]), [])

    second = deadline("s1", "a")
    with pytest.raises(RecordDataError) as refused:
        store.write(WriteSet(deadline_inserts=[second], outbox=[command("s1", 1)]), [])

    assert refused.value.sqlstate == "23505"
    assert list(deadlines_of(store, [first.id, second.id])) == [first.id]
    assert backing.outbox() == 0


def test_a_deadline_id_that_is_no_uuid_is_refused_data(backing: Backing) -> None:
    store = backing.store()
    with pytest.raises(RecordDataError) as refused:
        store.load(Wants(set(), set(), {"d-1"}))
    assert refused.value.sqlstate == "22P02"


# -- lost connections ----------------------------------------------------------------------------


@pytest.fixture
def pg_backing(request: pytest.FixtureRequest) -> Iterator[Backing]:
    """The PostgreSQL store alone: the in-memory one has no connection to lose."""
    yield from _postgres(request)


@pytest.mark.integration
def test_a_lost_connection_is_retryable_and_the_next_call_reconnects(
    pg_backing: Backing,
) -> None:
    backing = pg_backing
    assert backing.kill is not None
    store = backing.store()
    assert store.claim([A], "one") == {A: (1, None)}

    backing.kill()
    with pytest.raises(Retryable):
        store.read_offsets([A])
    assert store.read_offsets([A]) == {A: (1, None)}

    backing.kill()
    with pytest.raises(Retryable):
        store.write(started("s1", "m1", 0), [at(A, 1, None, 1)])
    assert store.read_offsets([A]) == {A: (1, None)}
    assert sagas_of(store, "s1") == {}

    store.write(started("s1", "m1", 0), [at(A, 1, None, 1)])
    assert store.read_offsets([A]) == {A: (1, 1)}

    backing.kill()
    with pytest.raises(Retryable):
        store.load(Wants({(SAGA, "s1")}, set(), set()))
    assert sagas_of(store, "s1") == {"s1": (ACTIVE, 1, {"id": "s1", "step": 1})}


@pytest.mark.integration
def test_a_lost_connection_during_claim_is_retryable(pg_backing: Backing) -> None:
    backing = pg_backing
    assert backing.kill is not None
    store = backing.store()
    store.read_offsets([A])

    backing.kill()
    with pytest.raises(Retryable):
        store.claim([A], "one")
    assert store.claim([A], "one") == {A: (1, None)}


@pytest.mark.integration
def test_a_connection_lost_at_commit_leaves_the_outcome_to_the_stored_offsets(
    pg_backing: Backing,
) -> None:
    backing = pg_backing
    assert backing.kill is not None
    store = backing.store()
    store.claim([A], "one")

    # The server ends the session while the batch waits to commit: the client cannot tell
    # whether COMMIT got through, so it says so; the offsets then show that it did not.
    with pytest.raises(CommitInDoubt):
        store.write(started("s1", "m1", 0), [at(A, 1, None, 1)], before_commit=backing.kill)

    assert store.read_offsets([A]) == {A: (1, None)}
    assert sagas_of(store, "s1") == {}


# -- retention -----------------------------------------------------------------------------------


def test_a_purged_ended_saga_loads_as_a_tombstone_and_a_running_one_keeps_its_ids(
    backing: Backing,
) -> None:
    assert backing.purge_ended is not None
    store = backing.store()
    store.claim([A], "one")
    store.write(started("s1", "m1", 0), [at(A, 1, None, 1)])
    store.write(started("s2", "m2", 1), [at(A, 2, 1, 1)])
    end = WriteSet(sagas=[saga("s1", 2, 1, ended=True)], history=[applied("s1", "m3", 2, 2)])
    store.write(end, [at(A, 3, 2, 1)])

    backing.purge_ended()

    loaded = store.load(Wants({(SAGA, "s1"), (SAGA, "s2")}, set(), set()))
    assert set(loaded.sagas) == {(SAGA, "s2")}
    assert set(loaded.tombstones) == {(SAGA, "s1")}
    # The ended saga's ids went with its history (its tombstone answers for it); the running
    # saga's stay, they are its duplicate detector.
    assert applied_of(store, [("s1", "m1"), ("s1", "m3"), ("s2", "m2")]) == {(SAGA, "s2", "m2")}
    # Purging again changes nothing, and the saga still reads as a tombstone.
    backing.purge_ended()
    assert set(store.load(Wants({(SAGA, "s1")}, set(), set())).tombstones) == {(SAGA, "s1")}


# -- records held behind a parked saga -------------------------------------------------------------


def test_held_records_load_in_arrival_order_with_the_sagas_deadlines_and_release_by_id(
    backing: Backing,
) -> None:
    store = backing.store()
    first = Record(A[0], A[1], 5, b"s1", b'{"n": 1}', (("message-id", b"m-5"),))
    second = Record(A[0], A[1], 6, b"s1", b'{"n": 2}', (("message-id", b"m-6"),))
    other = Record(A[0], A[1], 7, b"s2", b"{}", (("message-id", b"m-7"),))
    timeout = deadline("s1", "timeout")
    store.write(
        WriteSet(
            parked=[
                ParkedMessage(SAGA, "s1", first, "boom"),
                ParkedMessage(SAGA, "s2", other, "boom"),
                ParkedMessage(SAGA, "s1", second, "behind a parked saga"),
            ],
            deadline_inserts=[timeout],
        ),
        [],
    )
    # Without held keys nothing held is loaded: the consumer's batches pay nothing for it.
    assert store.load(Wants({(SAGA, "s1")}, set(), set())).held == {}

    loaded = store.load(Wants({(SAGA, "s1")}, set(), set(), {(SAGA, "s1")}))
    held = loaded.held[(SAGA, "s1")]
    assert [h.record for h in held] == [first, second]
    assert set(loaded.held) == {(SAGA, "s1")}
    assert loaded.deadlines[timeout.id] == DeadlineRef(SAGA, "s1", "timeout", DUE, None, None)

    store.write(WriteSet(held_releases=[held[0].parked_id]), [])
    again = store.load(Wants(set(), set(), set(), {(SAGA, "s1"), (SAGA, "s2")}))
    assert [h.record for h in again.held[(SAGA, "s1")]] == [second]
    assert [h.record for h in again.held[(SAGA, "s2")]] == [other]
    assert again.held[(SAGA, "s1")][0].parked_id == held[1].parked_id


def test_a_resets_history_loads_applied_and_replayed_inputs_in_order_with_the_deadlines(
    backing: Backing,
) -> None:
    store = backing.store()

    def row(mid: str, outcome: Outcome, sid: str = "s1", **kw: Any) -> HistoryRow:
        headers = {"message-id": mid, "message-type": "Ev"}
        return HistoryRow(
            SAGA, sid, mid, "Ev", "event", outcome, 1, A[0], A[1], 3, None, headers, **kw
        )

    start = row("m1", Outcome.APPLIED, payload=b'{"n": 1}', effects={"commands": [{"type": "C"}]})
    dup = row("m1", Outcome.DUPLICATE, payload=b'{"n": 1}')
    hashed = row("m2", Outcome.APPLIED, payload_sha256=b"\x01" * 32)
    again = row("m2", Outcome.REPLAYED, payload=b'{"n": 2}')
    other = row("m9", Outcome.APPLIED, sid="s2", payload=b"{}")
    timeout = deadline("s1", "timeout")
    store.write(
        WriteSet(history=[start, dup, hashed, again, other], deadline_inserts=[timeout]), []
    )
    # Without reset keys no history is loaded: a batch of events pays nothing for it.
    assert store.load(Wants({(SAGA, "s1")}, set(), set())).history == {}

    loaded = store.load(Wants({(SAGA, "s1")}, set(), set(), history_keys={(SAGA, "s1")}))

    inputs = loaded.history[(SAGA, "s1")]
    assert set(loaded.history) == {(SAGA, "s1")}
    assert [(p.message_id, p.outcome, p.payload) for p in inputs] == [
        ("m1", "applied", b'{"n": 1}'),
        ("m2", "applied", None),
        ("m2", "replayed", b'{"n": 2}'),
    ]
    assert inputs[0].headers == {"message-id": "m1", "message-type": "Ev"}
    assert inputs[0].effects == {"commands": [{"type": "C"}]}
    assert (inputs[0].topic, inputs[0].partition, inputs[0].offset, inputs[0].version) == (
        A[0],
        A[1],
        3,
        1,
    )
    assert loaded.deadlines[timeout.id] == DeadlineRef(SAGA, "s1", "timeout", DUE, None, None)


# -- the operators' audit trail ------------------------------------------------------------------


def test_a_batchs_audit_entries_are_stored_with_it_in_order_or_not_at_all(
    backing: Backing,
) -> None:
    zombie, owner = backing.store(), backing.store()
    zombie.claim([A], "zombie")
    owner.claim([A], "owner")
    odd = 'q"b\\s\nn\u2028l\U0001f600e'
    skip = AuditEntry("ana", "parked-skip", odd, SAGA, "s1", {"skipped": ["m-2"], "n": [1]})
    terminate = AuditEntry("ana", "terminate", "done", SAGA, "s1", {}, "operator-refused")
    batch = WriteSet(history=[applied("s1", "m1")], audit=[skip, terminate])

    with pytest.raises(FencedOut):
        zombie.write(batch, [at(A, 1, None, 1)])
    assert backing.audit() == []

    owner.write(batch, [at(A, 1, None, 2)])
    stored = backing.audit()[::-1]
    assert [
        (a.actor, a.action, a.reason, a.saga_type, a.saga_id, a.target, a.outcome) for a in stored
    ] == [
        ("ana", "parked-skip", odd, SAGA, "s1", {"skipped": ["m-2"], "n": [1]}, "applied"),
        ("ana", "terminate", "done", SAGA, "s1", {}, "operator-refused"),
    ]
    assert stored[0].id < stored[1].id
    assert stored[0].at == stored[1].at  # one transaction
