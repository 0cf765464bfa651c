"""One set of outbox cases, run against the in-memory store and the PostgreSQL one.

Both must give the same results: claims in id order, rollback puts every row back, and only one
claim at a time across relays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from processor.engine.records import OutboxRow
from processor.memory.outbox import MemoryOutboxStore
from processor.ports import OutboxEntry, OutboxStore


@dataclass
class Outbox:
    """One backing outbox, seen through as many store handles (relays) as a case needs."""

    store: Callable[[], OutboxStore]
    append: Callable[[list[OutboxRow]], list[int]]
    pending: Callable[[], list[OutboxEntry]]


def _memory() -> Iterator[Outbox]:
    store = MemoryOutboxStore()
    # One object is every relay's view of the same outbox; its lock is not reentrant.
    yield Outbox(lambda: store, store.append, store.pending)


def _postgres(request: pytest.FixtureRequest) -> Iterator[Outbox]:
    from psycopg.types.json import Jsonb

    from processor.postgres.connect import connect, ensure_schema
    from processor.postgres.outbox import PostgresOutboxStore
    from processor.postgres.schema import Tables

    database_url: str = request.getfixturevalue("database_url")
    tables = Tables(schema=request.getfixturevalue("pg_schema"))
    ensure_schema(database_url, tables)
    opened: list[OutboxStore] = []
    insert = tables.render(
        "INSERT INTO {outbox} (saga_type, saga_id, topic, partition, key, headers, value)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id"
    )
    select = tables.render(
        "SELECT id, saga_type, saga_id, topic, partition, key, headers, value"
        " FROM {outbox} ORDER BY id"
    )

    with connect(database_url, autocommit=True) as admin:

        def store() -> OutboxStore:
            opened.append(PostgresOutboxStore(lambda: connect(database_url), tables))
            return opened[-1]

        def append(rows: list[OutboxRow]) -> list[int]:
            ids = []
            for r in rows:
                params = (r.saga_type, r.saga_id, r.topic, r.partition, r.key)
                found = admin.execute(insert, (*params, Jsonb(dict(r.headers)), r.value))
                ids.append(found.fetchone()[0])  # type: ignore[index]
            return ids

        def pending() -> list[OutboxEntry]:
            return [
                OutboxEntry(i, OutboxRow(st, sid, topic, key, headers, value, partition))
                for i, st, sid, topic, partition, key, headers, value in admin.execute(select)
            ]

        try:
            yield Outbox(store, append, pending)
        finally:
            for s in opened:
                s.close()


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.integration)])
def outbox(request: pytest.FixtureRequest) -> Iterator[Outbox]:
    if request.param == "memory":
        yield from _memory()
    else:
        yield from _postgres(request)


def row(saga_id: str, n: int, *, partition: int | None = None) -> OutboxRow:
    return OutboxRow(
        saga_type="transfer",
        saga_id=saga_id,
        topic="commands",
        key=saga_id.encode() if n % 2 else None,
        headers={"message-id": f"{saga_id}-{n}", "message-type": "Debit"},
        value=f"{saga_id}:{n}".encode(),
        partition=partition,
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
