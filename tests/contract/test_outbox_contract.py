"""One set of outbox cases, run against the in-memory store and the PostgreSQL one.

Both must give the same results: claims in id order, rollback puts every row back, rows of no
source partition by one claim at a time across relays, rows of a source partition only by claims
that hold its current owner epoch (several at once), and a saga's row held while an older row of
the saga from another source is still in the outbox.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pytest

from processor._engine.records import OutboxRow
from processor._engine.rows import AuditEntry
from processor._memory.outbox import MemoryOutboxStore
from processor._ports import (
    FAILED_VALUE_PREVIEW,
    TP,
    FailedOutboxStore,
    OutboxEntry,
    OutboxStore,
    SetAside,
)
from processor._ports.views import AuditRow
from tests.contract import BACKENDS


@dataclass
class Outbox:
    """One backing outbox, seen through as many store handles (relays) as a case needs."""

    store: Callable[[], OutboxStore]
    append: Callable[[list[OutboxRow]], list[int]]
    pending: Callable[[], list[OutboxEntry]]
    failed: FailedOutboxStore
    # A new owner's claim of partitions (bumps their epochs); returns the epochs it holds.
    take_over: Callable[[list[TP]], dict[TP, int]]
    # The audit trail's entries, newest first.
    audit: Callable[[], list[AuditRow]]


def _memory() -> Iterator[Outbox]:
    store = MemoryOutboxStore()
    # One object is every relay's view of the same outbox; its lock is not reentrant.
    yield Outbox(
        lambda: store, store.append, store.pending, store, store.take_over, store.audit.audit
    )


def _postgres(request: pytest.FixtureRequest) -> Iterator[Outbox]:
    from psycopg.types.json import Jsonb

    from processor._postgres.batch.store import BatchSql
    from processor._postgres.connect import connect, ensure_schema
    from processor._postgres.failed_outbox import PostgresFailedOutbox
    from processor._postgres.outbox import PostgresOutboxStore
    from processor._postgres.reads.inspect import InspectQueries
    from processor._postgres.schema.tables import Tables

    database_url: str = request.getfixturevalue("database_url")
    tables = Tables(schema=request.getfixturevalue("pg_schema"))
    ensure_schema(database_url, tables)
    opened: list[OutboxStore] = []
    insert = tables.render(
        "INSERT INTO {outbox} (saga_type, saga_id, topic, partition, key, headers, value,"
        " source_topic, source_partition)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id"
    )
    select = tables.render(
        "SELECT id, saga_type, saga_id, topic, partition, key, headers, value, attempts,"
        " source_topic, source_partition FROM {outbox} ORDER BY id"
    )

    with connect(database_url, autocommit=True) as admin:

        def store() -> OutboxStore:
            opened.append(PostgresOutboxStore(lambda: connect(database_url), tables, GROUP))
            return opened[-1]

        def append(rows: list[OutboxRow]) -> list[int]:
            ids = []
            for r in rows:
                params = (r.saga_type, r.saga_id, r.topic, r.partition, r.key)
                source = r.source or (None, None)
                found = admin.execute(insert, (*params, Jsonb(dict(r.headers)), r.value, *source))
                ids.append(found.fetchone()[0])  # type: ignore[index]
            return ids

        def pending() -> list[OutboxEntry]:
            return [
                OutboxEntry(
                    i,
                    OutboxRow(
                        st, sid, topic, key, headers, value, partition, (s, sp) if s else None
                    ),
                    n,
                )
                for i, st, sid, topic, partition, key, headers, value, n, s, sp in admin.execute(
                    select
                )
            ]

        def take_over(tps: list[TP]) -> dict[TP, int]:
            # The worker's own ownership claim, on a connection of its own.
            with connect(database_url) as conn:
                claimed = BatchSql(conn, tables, GROUP).claim(tps, "owner")
            return {tp: epoch for tp, (epoch, _) in claimed.items()}

        try:
            yield Outbox(
                store,
                append,
                pending,
                PostgresFailedOutbox(admin, tables),
                take_over,
                InspectQueries(admin, tables).audit,
            )
        finally:
            for s in opened:
                s.close()


@pytest.fixture(params=BACKENDS)
def outbox(request: pytest.FixtureRequest) -> Iterator[Outbox]:
    if request.param == "memory":
        yield from _memory()
    else:
        yield from _postgres(request)


GROUP = "contract-group"
T0: TP = ("events", 0)
T1: TP = ("events", 1)


def row(
    saga_id: str, n: int, *, partition: int | None = None, source: TP | None = None
) -> OutboxRow:
    return OutboxRow(
        saga_type="transfer",
        saga_id=saga_id,
        topic="commands",
        key=saga_id.encode() if n % 2 else None,
        headers={"message-id": f"{saga_id}-{n}", "message-type": "Debit"},
        value=f"{saga_id}:{n}".encode(),
        partition=partition,
        source=source,
    )


def test_claims_committed_rows_in_id_order_and_removes_them(outbox: Outbox) -> None:
    rows = [row("a", 1), row("b", 1, partition=3), row("a", 2), row("c", 1), row("b", 2)]
    ids = outbox.append(rows)
    assert ids == sorted(ids)
    store = outbox.store()

    with store.claim(3) as claimed:
        assert claimed is not None
        assert claimed == [OutboxEntry(i, r) for i, r in zip(ids[:3], rows[:3], strict=True)]

    assert outbox.pending() == [OutboxEntry(i, r) for i, r in zip(ids[3:], rows[3:], strict=True)]
    with store.claim(10) as rest:
        assert rest is not None
        assert [e.id for e in rest] == ids[3:]
    assert outbox.pending() == []


def test_an_empty_outbox_claims_an_empty_list(outbox: Outbox) -> None:
    with outbox.store().claim(10) as claimed:
        assert claimed == []


def test_leaving_with_an_exception_puts_every_row_back(outbox: Outbox) -> None:
    rows = [row("a", 1), row("a", 2), row("b", 1)]
    ids = outbox.append(rows)
    store = outbox.store()

    seen: list[int] = []

    def fail_inside_claim() -> None:
        with store.claim(2) as claimed:
            assert claimed is not None
            seen.extend(e.id for e in claimed)
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        fail_inside_claim()

    assert seen == ids[:2]
    assert [e.id for e in outbox.pending()] == ids
    # The same rows come back, in the same order.
    with store.claim(2) as again:
        assert again is not None
        assert [e.id for e in again] == ids[:2]
    assert [e.id for e in outbox.pending()] == ids[2:]


def test_a_second_claim_while_one_is_open_gets_none(outbox: Outbox) -> None:
    ids = outbox.append([row("a", 1), row("a", 2)])
    first, second = outbox.store(), outbox.store()

    with first.claim(1) as taken:
        assert taken is not None
        assert [e.id for e in taken] == ids[:1]
        with second.claim(10) as other:
            assert other is None
        # Claimed but not committed: still there for everyone else.
        assert [e.id for e in outbox.pending()] == ids

    with second.claim(10) as rest:
        assert rest is not None
        assert [e.id for e in rest] == ids[1:]
    assert outbox.pending() == []


def test_a_row_committed_during_a_claim_waits_for_the_next_one(outbox: Outbox) -> None:
    (early,) = outbox.append([row("a", 1)])
    store = outbox.store()

    with store.claim(10) as claimed:
        assert claimed is not None
        (late,) = outbox.append([row("a", 2)])
        assert [e.id for e in claimed] == [early]

    assert [e.id for e in outbox.pending()] == [late]
    with store.claim(10) as next_round:
        assert next_round is not None
        assert [e.id for e in next_round] == [late]


def test_settle_keeps_some_rows_counting_attempts_and_sets_others_aside(outbox: Outbox) -> None:
    rows = [row("a", 1), row("a", 2), row("b", 1), row("c", 1), row("d", 1)]
    ids = outbox.append(rows)
    store = outbox.store()

    with store.claim(10) as claimed:
        assert claimed is not None
        assert [(e.attempts, e.behind) for e in claimed] == [(0, None)] * 5
        store.settle(
            [SetAside(ids[0], "too large", 1), SetAside(ids[1], "held", 0, held_behind=ids[0])],
            {ids[2]: "timed out", ids[3]: None},
        )

    # Kept rows stay under their own ids; only the one with a reason counts an attempt.
    assert [(e.id, e.row, e.attempts) for e in outbox.pending()] == [
        (ids[2], rows[2], 1),
        (ids[3], rows[3], 0),
    ]
    failed = outbox.failed.list_failed()
    assert [(f.id, f.row, f.reason, f.attempts, f.held_behind) for f in failed] == [
        (ids[0], rows[0], "too large", 1, None),
        (ids[1], rows[1], "held", 0, ids[0]),
    ]
    assert failed[0].failed_at >= failed[0].created_at
    assert outbox.failed.list_failed("transfer", "b") == []

    # A later row of a saga with a set-aside row says so when claimed.
    (later,) = outbox.append([row("a", 3)])
    with store.claim(10) as again:
        assert again is not None
        assert [(e.id, e.attempts, e.behind) for e in again] == [
            (ids[2], 1, None),
            (ids[3], 0, None),
            (later, 0, ids[0]),
        ]
        store.settle([], dict.fromkeys((e.id for e in again), None))
    assert [e.id for e in outbox.pending()] == [ids[2], ids[3], later]


def test_settle_is_rolled_back_with_the_claim(outbox: Outbox) -> None:
    ids = outbox.append([row("a", 1), row("b", 1)])
    store = outbox.store()

    def fail_after_settling() -> None:
        with store.claim(10) as claimed:
            assert claimed is not None
            store.settle([SetAside(ids[0], "too large", 1)], {ids[1]: "timed out"})
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        fail_after_settling()

    assert [(e.id, e.attempts) for e in outbox.pending()] == [(ids[0], 0), (ids[1], 0)]
    assert outbox.failed.list_failed() == []


def test_retry_puts_a_sagas_rows_back_under_their_ids_and_discard_drops_them(
    outbox: Outbox,
) -> None:
    rows = [row("a", 1), row("a", 2), row("b", 1), row("a", 3)]
    ids = outbox.append(rows)
    store = outbox.store()
    with store.claim(10) as claimed:
        assert claimed is not None
        store.settle(
            [
                SetAside(ids[0], "unknown topic", 1),
                SetAside(ids[1], "held", 0, ids[0]),
                SetAside(ids[2], "too large", 1),
                SetAside(ids[3], "held", 0, ids[0]),
            ],
            {},
        )
    (newer,) = outbox.append([row("c", 1)])

    # A row id of a saga takes the whole saga, in order.
    back = outbox.failed.retry_failed(row_id=ids[1])
    assert [(b.id, b.row) for b in back] == [
        (ids[0], rows[0]),
        (ids[1], rows[1]),
        (ids[3], rows[3]),
    ]
    assert [(e.id, e.row) for e in outbox.pending()] == [
        (ids[0], rows[0]),
        (ids[1], rows[1]),
        (ids[3], rows[3]),
        (newer, row("c", 1)),
    ]
    assert [f.id for f in outbox.failed.list_failed()] == [ids[2]]
    assert outbox.failed.retry_failed(saga_type="transfer", saga_id="a") == []

    gone = outbox.failed.discard_failed(saga_type="transfer", saga_id="b")
    assert [g.id for g in gone] == [ids[2]]
    assert outbox.failed.list_failed() == []
    with store.claim(10) as claimed:
        assert claimed is not None
        assert [e.id for e in claimed] == [ids[0], ids[1], ids[3], newer]


def test_a_retry_and_a_discard_are_audited_with_the_rows_they_moved(outbox: Outbox) -> None:
    rows = [row("a", 1), row("a", 2), row("b", 1)]
    ids = outbox.append(rows)
    store = outbox.store()
    with store.claim(10) as claimed:
        assert claimed is not None
        store.settle(
            [
                SetAside(ids[0], "unknown topic", 1),
                SetAside(ids[1], "held", 0, ids[0]),
                SetAside(ids[2], "too large", 1),
            ],
            {},
        )
    retried = AuditEntry("ana", "outbox-retry", None, target={"row_id": ids[1]}, outcome="retried")
    outbox.failed.retry_failed(row_id=ids[1], audit=retried)
    # Nothing matches: nothing moved, nothing recorded.
    outbox.failed.discard_failed(saga_type="transfer", saga_id="a", audit=retried)
    discarded = AuditEntry("bo", "outbox-discard", "sent by hand", "transfer", "b")
    outbox.failed.discard_failed(saga_type="transfer", saga_id="b", audit=discarded)

    [second, first] = outbox.audit()
    assert (first.actor, first.action, first.reason, first.outcome) == (
        "ana",
        "outbox-retry",
        None,
        "retried",
    )
    # Picked by a row id, the entry names the rows' saga.
    assert (first.saga_type, first.saga_id) == ("transfer", "a")
    assert first.target == {"row_id": ids[1], "count": 2, "ids": ids[:2]}
    assert (second.actor, second.saga_id, second.target) == (
        "bo",
        "b",
        {"count": 1, "ids": ids[2:]},
    )
    assert second.id > first.id


# -- rows of source partitions, fenced by the owner epoch -------------------------------------


def _ids(entries: list[OutboxEntry] | None) -> list[int]:
    assert entries is not None
    return [e.id for e in entries]


def test_a_claim_takes_only_the_rows_of_its_own_partitions(outbox: Outbox) -> None:
    epochs = outbox.take_over([T0, T1])
    ids = outbox.append(
        [
            row("a", 1, source=T0),
            row("b", 1, source=T1),
            row("a", 2, source=T0),
            row("c", 1),
            row("b", 2, source=T1),
        ]
    )
    first, second = outbox.store(), outbox.store()

    with first.claim(10, {T0: epochs[T0]}) as mine:
        # Its partition's rows, and the rows of no source (the global path was free).
        assert _ids(mine) == [ids[0], ids[2], ids[3]]
        assert mine is not None
        assert mine[0].row == row("a", 1, source=T0)
        # Another relay publishes its own partition meanwhile, without the global rows.
        with second.claim(10, {T1: epochs[T1]}) as theirs:
            assert _ids(theirs) == [ids[1], ids[4]]
    assert outbox.pending() == []


def test_a_claim_at_a_stale_epoch_takes_nothing_of_the_partition(outbox: Outbox) -> None:
    old = outbox.take_over([T0])[T0]
    ids = outbox.append([row("a", 1, source=T0), row("a", 2, source=T0)])
    new = outbox.take_over([T0])[T0]
    assert new > old
    store = outbox.store()

    with store.claim(10, {T0: old}) as stale:
        assert stale == []
    with store.claim(10, {T0: new}) as current:
        assert _ids(current) == ids


def test_a_take_over_waits_for_a_claim_in_flight_on_the_partition(outbox: Outbox) -> None:
    epoch = outbox.take_over([T0, T1])
    ids = outbox.append([row("a", 1, source=T0), row("b", 1, source=T1)])
    store = outbox.store()
    result: dict[TP, int] = {}
    other = threading.Thread(target=lambda: result.update(outbox.take_over([T1])))

    with store.claim(10, {T0: epoch[T0]}) as claimed:
        assert _ids(claimed) == ids[:1]
        # A partition no claim holds is taken over at once.
        other.start()
        other.join(10)
        assert result == {T1: epoch[T1] + 1}
        taker = threading.Thread(target=lambda: result.update(outbox.take_over([T0])))
        taker.start()
        taker.join(0.5)
        assert taker.is_alive(), "the epoch bump did not wait for the claim in flight"
    taker.join(10)
    assert result[T0] == epoch[T0] + 1
    # The old owner's next claim takes nothing of it; the new owner's takes the rest.
    assert [e.id for e in outbox.pending()] == ids[1:]
    with store.claim(10, {T1: epoch[T1]}) as stale:
        assert stale == []
    with store.claim(10, {T1: result[T1]}) as current:
        assert _ids(current) == ids[1:]


def _no_saga(n: int, source: TP) -> OutboxRow:
    return OutboxRow(
        None, None, "dead-letters", None, {"message-id": f"dl-{n}"}, b"x", None, source
    )


def test_a_partition_row_waits_behind_an_older_row_of_its_saga_from_another_partition(
    outbox: Outbox,
) -> None:
    # After a growth: saga a's first command came from partition T0, its next ones from T1.
    epochs = outbox.take_over([T0, T1])
    ids = outbox.append(
        [
            row("a", 1, source=T0),
            row("b", 1, source=T1),
            row("a", 2, source=T1),
            _no_saga(1, T1),
            row("a", 3, source=T1),
        ]
    )
    old, new = outbox.store(), outbox.store()

    # T1's owner: nothing of saga a while its older row of T0 is pending; the rest flows.
    with new.claim(10, {T1: epochs[T1]}) as first:
        assert _ids(first) == [ids[1], ids[3]]
    with old.claim(10, {T0: epochs[T0]}) as published:
        assert _ids(published) == [ids[0]]
        # Claimed but not committed: the row is still there, and still holds saga a back.
        with new.claim(10, {T1: epochs[T1]}) as meanwhile:
            assert _ids(meanwhile) == []
    with new.claim(10, {T1: epochs[T1]}) as rest:
        assert _ids(rest) == [ids[2], ids[4]]
    assert outbox.pending() == []


def test_a_sagas_rows_alternating_between_partitions_go_out_one_source_at_a_time(
    outbox: Outbox,
) -> None:
    # A saga parked before a growth and retried after it writes under its old partition again.
    epochs = outbox.take_over([T0, T1])
    ids = outbox.append(
        [
            row("a", 1, source=T0),
            row("a", 2, source=T1),
            row("a", 3, source=T0),
            row("a", 4, source=T0),
            row("a", 5, source=T1),
        ]
    )
    store = outbox.store()

    # Even a relay owning both partitions takes one run of a source per claim: the run before
    # it, of the other source, holds it back until its claim has committed.
    rounds = []
    for _ in range(5):
        with store.claim(10, epochs) as claimed:
            rounds.append(_ids(claimed))
    assert rounds == [[ids[0]], [ids[1]], [ids[2], ids[3]], [ids[4]], []]


def test_a_row_behind_a_failed_row_of_another_partition_is_claimed_knowing_it(
    outbox: Outbox,
) -> None:
    epochs = outbox.take_over([T0, T1])
    ids = outbox.append([row("a", 1, source=T0), row("a", 2, source=T1)])
    store = outbox.store()
    with store.claim(10, {T0: epochs[T0]}) as claimed:
        assert _ids(claimed) == [ids[0]]
        store.settle([SetAside(ids[0], "unknown topic", 1)], {})

    # The older row left the outbox for the failed one: the later row is claimed, and says
    # which failed row it is held behind.
    with store.claim(10, {T1: epochs[T1]}) as claimed:
        assert claimed is not None
        assert [(e.id, e.behind) for e in claimed] == [(ids[1], ids[0])]


def test_rows_of_no_source_go_to_one_claim_at_a_time(outbox: Outbox) -> None:
    epochs = outbox.take_over([T0])
    ids = outbox.append([row("a", 1), row("b", 1, source=T0), row("c", 1)])
    first, second = outbox.store(), outbox.store()

    with first.claim(10) as global_only:
        assert _ids(global_only) == [ids[0], ids[2]]
        # The global path is taken: a claim for no partition gets None, one for a partition
        # gets that partition's rows only.
        with second.claim(10) as none:
            assert none is None
        with second.claim(10, epochs) as partition:
            assert _ids(partition) == [ids[1]]


def test_a_partition_row_waits_behind_an_older_row_of_no_source_of_its_saga(
    outbox: Outbox,
) -> None:
    epochs = outbox.take_over([T0])
    ids = outbox.append(
        [row("a", 1), row("a", 2, source=T0), row("b", 1, source=T0), row("a", 3, source=T0)]
    )
    first, second = outbox.store(), outbox.store()

    with first.claim(10) as legacy:
        assert _ids(legacy) == [ids[0]]
        with second.claim(10, epochs) as partition:
            # Saga a's rows wait for its older row of no source; saga b's go.
            assert _ids(partition) == [ids[2]]
    with second.claim(10, epochs) as rest:
        assert _ids(rest) == [ids[1], ids[3]]


def test_a_retried_row_keeps_its_source(outbox: Outbox) -> None:
    epochs = outbox.take_over([T0])
    rows = [row("a", 1, source=T0), row("a", 2, source=T0)]
    ids = outbox.append(rows)
    store = outbox.store()
    with store.claim(10, epochs) as claimed:
        assert _ids(claimed) == ids
        store.settle(
            [SetAside(ids[0], "unknown topic", 1), SetAside(ids[1], "held", 0, ids[0])], {}
        )
    assert [f.row for f in outbox.failed.list_failed()] == rows

    back = outbox.failed.retry_failed(row_id=ids[0])
    assert [b.row for b in back] == rows
    assert [(e.id, e.row) for e in outbox.pending()] == list(zip(ids, rows, strict=True))
    # Back on its partition's path: a claim for no partition does not take it.
    with store.claim(10) as global_only:
        assert global_only == []
    with store.claim(10, epochs) as again:
        assert _ids(again) == ids
        assert again is not None
        assert [e.row for e in again] == rows


def _big(saga_id: str, size: int, source: TP | None = None) -> OutboxRow:
    return OutboxRow(
        saga_type="transfer",
        saga_id=saga_id,
        topic="dead-letters",
        key=None,
        headers={"message-id": f"{saga_id}-big"},
        value=b"x" * size,
        source=source,
    )


def test_a_claim_is_bounded_by_bytes_and_always_takes_the_first_row(outbox: Outbox) -> None:
    ids = outbox.append([_big("a", 600), _big("b", 600), _big("c", 600), _big("d", 600)])
    store = outbox.store()
    # 1000 bytes: the second row starts under the bound (600), the third would not (1200).
    with store.claim(10, max_bytes=1000) as first:
        assert _ids(first) == ids[:2]
    # A row larger than the bound goes alone rather than never.
    with store.claim(10, max_bytes=100) as second:
        assert _ids(second) == [ids[2]]
    with store.claim(10) as rest:
        assert _ids(rest) == [ids[3]]
    assert outbox.pending() == []


def test_the_byte_bound_spans_rows_of_no_source_and_partition_rows(outbox: Outbox) -> None:
    epochs = outbox.take_over([T0])
    ids = outbox.append(
        [_big("a", 600, source=T0), _big("g", 600), _big("b", 600, source=T0), _big("h", 600)]
    )
    store = outbox.store()
    # Rows of no source first (the global path), then the partition's, in one budget.
    with store.claim(10, {T0: epochs[T0]}, max_bytes=1000) as claimed:
        assert _ids(claimed) == [ids[1], ids[3]]
    with store.claim(10, {T0: epochs[T0]}, max_bytes=1000) as claimed:
        assert _ids(claimed) == [ids[0], ids[2]]
    assert outbox.pending() == []


def test_the_byte_bound_is_taken_over_the_oldest_rows_before_the_saga_guard(
    outbox: Outbox,
) -> None:
    epochs = outbox.take_over([T0, T1])
    ids = outbox.append(
        [
            _big("b", 600, source=T1),
            _big("a", 600, source=T0),
            _big("b", 600, source=T0),
            _big("c", 600, source=T0),
        ]
    )
    store = outbox.store()
    # T0's two oldest rows fill the bound; saga b's is held behind its row of T1, so only one
    # goes, and saga c's waits for a later claim rather than taking the held row's place.
    with store.claim(10, {T0: epochs[T0]}, max_bytes=1000) as claimed:
        assert _ids(claimed) == [ids[1]]


def test_failed_rows_show_a_bounded_value_with_its_size_and_a_retry_loses_nothing(
    outbox: Outbox,
) -> None:
    # Bytes that differ along the value (and are not UTF-8), so a cut in the wrong place shows.
    whole = bytes(range(256)) * (FAILED_VALUE_PREVIEW // 256 + 10)
    big, held = replace(_big("a", 0), value=whole), row("a", 1)
    other = replace(_big("b", 0), value=whole[::-1])
    ids = outbox.append([big, held, other])
    store = outbox.store()
    with store.claim(10) as claimed:
        assert _ids(claimed) == ids
        store.settle(
            [
                SetAside(ids[0], "too large", 1),
                SetAside(ids[1], "held", 0, ids[0]),
                SetAside(ids[2], "too large", 1),
            ],
            {},
        )

    listed = outbox.failed.list_failed()
    assert [(f.id, f.value_bytes) for f in listed] == [
        (ids[0], len(whole)),
        (ids[1], len(held.value)),
        (ids[2], len(whole)),
    ]
    assert listed[0].row == replace(big, value=whole[:FAILED_VALUE_PREVIEW])
    assert listed[1].row == held

    back = outbox.failed.retry_failed(row_id=ids[0])
    assert [(b.id, b.value_bytes, b.row.value) for b in back] == [
        (ids[0], len(whole), whole[:FAILED_VALUE_PREVIEW]),
        (ids[1], len(held.value), held.value),
    ]
    gone = outbox.failed.discard_failed(row_id=ids[2])
    assert [(g.id, g.value_bytes, g.row.value) for g in gone] == [
        (ids[2], len(whole), whole[::-1][:FAILED_VALUE_PREVIEW])
    ]
    # Nothing lost: the outbox holds the whole value again, and the next claim takes it.
    assert [(e.id, e.row) for e in outbox.pending()] == [(ids[0], big), (ids[1], held)]
    with store.claim(10) as again:
        assert again is not None
        assert [(e.id, e.row) for e in again] == [(ids[0], big), (ids[1], held)]
