"""Operator stores: the cases the in-memory adapters and the PostgreSQL ones both answer.

The memory side implements two of the operator ports in part: the failed outbox
(:class:`processor._ports.FailedOutboxStore`, by ``MemoryOutboxStore``) and the audit trail of
:class:`processor._ports.InspectStore` (``record_audit`` and ``audit``, by ``MemoryAuditLog``,
whose ``record`` takes a list). ``OperatorStore``, ``ParkedStore`` and the rest of
``InspectStore`` have no memory adapter; the claim and settle rules of the outbox are in
``test_outbox_contract``.

Both must agree: an operator's audit entries read back newest first, narrowed by type, id,
action, age, batch and limit; failed rows list in id order with their value cut to the preview
and its whole size; a retry by a row id takes the row's whole saga back under its ids, keeping
its source partition, while a discard by a row id takes that row alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import pytest

from processor._engine.records import OutboxRow
from processor._engine.rows import AuditEntry
from processor._memory.audit import MemoryAuditLog
from processor._memory.outbox import MemoryOutboxStore
from processor._ports import (
    FAILED_VALUE_PREVIEW,
    TP,
    FailedOutboxStore,
    OutboxEntry,
    OutboxStore,
    SetAside,
)
from tests.contract import BACKENDS
from tests.support.clocks import moved_back


@dataclass
class Operator:
    """One backing store, through the operator's ports and a relay's."""

    failed: FailedOutboxStore
    relay: OutboxStore
    append: Callable[[list[OutboxRow]], list[int]]
    pending: Callable[[], list[OutboxEntry]]
    record_audit: Callable[[AuditEntry], None]
    # The audit trail's entries (AuditRow), newest first, as InspectStore.audit filters them.
    audit: Callable[..., list[Any]]
    # Makes every audit entry recorded so far this much older.
    age_audit: Callable[[timedelta], None]
    # A new owner's claim of partitions; the epochs it holds.
    take_over: Callable[[list[TP]], dict[TP, int]]


def _memory() -> Iterator[Operator]:
    trail = MemoryAuditLog()
    outbox = MemoryOutboxStore(trail)

    def age_audit(by: timedelta) -> None:
        trail.rows = [replace(r, at=r.at - by) for r in trail.rows]

    yield Operator(
        outbox,
        outbox,
        outbox.append,
        outbox.pending,
        lambda entry: trail.record([entry]),
        trail.audit,
        age_audit,
        outbox.take_over,
    )


def _postgres(request: pytest.FixtureRequest) -> Iterator[Operator]:
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
        relay = PostgresOutboxStore(lambda: connect(database_url), tables, GROUP)
        inspect = InspectQueries(admin, tables)

        def append(rows: list[OutboxRow]) -> list[int]:
            ids = []
            for r in rows:
                source = r.source or (None, None)
                found = admin.execute(
                    insert,
                    (r.saga_type, r.saga_id, r.topic, r.partition, r.key, Jsonb(dict(r.headers)),
                     r.value, *source),
                ).fetchone()  # fmt: skip
                assert found is not None
                ids.append(int(found[0]))
            return ids

        def pending() -> list[OutboxEntry]:
            return [
                OutboxEntry(
                    i, OutboxRow(st, sid, t, k, h, v, p, (s, sp) if s else None), n
                )
                for i, st, sid, t, p, k, h, v, n, s, sp in admin.execute(select)
            ]  # fmt: skip

        def age_audit(by: timedelta) -> None:
            admin.execute(tables.render(f"UPDATE {{audit}} SET at = {moved_back('at')}"), (by,))

        def take_over(tps: list[TP]) -> dict[TP, int]:
            with connect(database_url) as conn:
                claimed = BatchSql(conn, tables, GROUP).claim(tps, "owner")
            return {tp: epoch for tp, (epoch, _) in claimed.items()}

        try:
            yield Operator(
                PostgresFailedOutbox(admin, tables),
                relay,
                append,
                pending,
                inspect.record_audit,
                inspect.audit,
                age_audit,
                take_over,
            )
        finally:
            relay.close()


@pytest.fixture(params=BACKENDS)
def operator(request: pytest.FixtureRequest) -> Iterator[Operator]:
    if request.param == "memory":
        yield from _memory()
    else:
        yield from _postgres(request)


GROUP = "operator-group"
SOURCE: TP = ("orders", 3)


def row(saga_id: str | None, n: int, value: bytes = b"{}", source: TP | None = None) -> OutboxRow:
    return OutboxRow(
        "transfer" if saga_id else None,
        saga_id,
        "commands",
        f"{saga_id}".encode(),
        {"message-id": f"{saga_id}-{n}"},
        value,
        None,
        source,
    )


def set_aside(operator: Operator, rows: list[OutboxRow]) -> list[int]:
    """Appends the rows and sets every one aside, the first of each saga failed, the rest held."""
    ids = operator.append(rows)
    first: dict[str | None, int] = {}
    aside = []
    for i, r in zip(ids, rows, strict=True):
        behind = first.get(r.saga_id) if r.saga_id is not None else None
        if behind is None:
            first[r.saga_id] = i
        aside.append(SetAside(i, "held" if behind else "refused", 1, behind))
    owned = operator.take_over([SOURCE])
    with operator.relay.claim(len(ids), owned) as claimed:
        assert claimed is not None
        assert [e.id for e in claimed] == ids
        operator.relay.settle(aside, {})
    assert operator.pending() == []
    return ids


# -- the audit trail ---------------------------------------------------------------------------


def test_audit_entries_read_back_newest_first_narrowed_by_the_filters(
    operator: Operator,
) -> None:
    odd = 'q"b\\s\nn\u2028l\U0001f600e'
    operator.record_audit(AuditEntry("ana", "dlq-purge", "old", target={"ids": [1, 2]}))
    operator.age_audit(timedelta(hours=2))
    operator.record_audit(AuditEntry("bo", "terminate", odd, "transfer", "s-1", {}, "refused"))
    operator.record_audit(AuditEntry("ana", "terminate", None, "transfer", "s-2"))
    operator.record_audit(AuditEntry("cy", "retry", "again", "wallet", "s-1"))

    every = operator.audit()
    assert [(a.actor, a.action, a.reason, a.saga_type, a.saga_id, a.outcome) for a in every] == [
        ("cy", "retry", "again", "wallet", "s-1", "applied"),
        ("ana", "terminate", None, "transfer", "s-2", "applied"),
        ("bo", "terminate", odd, "transfer", "s-1", "refused"),
        ("ana", "dlq-purge", "old", None, None, "applied"),
    ]
    assert every[-1].target == {"ids": [1, 2]}
    assert [a.id for a in every] == sorted((a.id for a in every), reverse=True)
    assert every[0].at - every[-1].at >= timedelta(hours=1)

    def actors(**filters: object) -> list[str]:
        return [a.actor for a in operator.audit(**filters)]

    assert actors(saga_type="transfer") == ["ana", "bo"]
    assert actors(saga_type="transfer", saga_id="s-1") == ["bo"]
    assert actors(saga_id="s-1") == ["cy", "bo"]
    assert actors(action="terminate") == ["ana", "bo"]
    assert actors(since=timedelta(hours=1)) == ["cy", "ana", "bo"]
    assert actors(since=timedelta(hours=3)) == ["cy", "ana", "bo", "ana"]
    assert actors(limit=2) == ["cy", "ana"]
    assert actors(action="none") == []


def test_audit_entries_of_a_batch_are_read_back_by_its_id(operator: Operator) -> None:
    own = {"batch": "b1", "where": {"type": "transfer"}, "matched": 2}
    operator.record_audit(AuditEntry("ana", "batch-cancel", "r", target=own, outcome="sent"))
    for n, batch in ((1, "b1"), (2, "b2"), (3, None)):
        target = {"request": f"operator:{n}", **({"batch": batch} if batch else {})}
        operator.record_audit(AuditEntry("ana", "cancel", "r", "transfer", f"s-{n}", target))
    assert [(a.action, a.saga_id) for a in operator.audit(batch="b1")] == [
        ("cancel", "s-1"),
        ("batch-cancel", None),
    ]
    assert [a.saga_id for a in operator.audit(batch="b2", action="cancel")] == ["s-2"]
    assert operator.audit(batch="b3") == []


# -- the failed outbox -------------------------------------------------------------------------


def test_failed_rows_list_in_id_order_with_the_value_cut_to_its_preview(
    operator: Operator,
) -> None:
    big = bytes(range(256)) * (FAILED_VALUE_PREVIEW // 256 + 10)
    rows = [row("a", 1, big), row("b", 1), row("a", 2), row(None, 1), row("c", 1)]
    ids = set_aside(operator, rows)

    listed = operator.failed.list_failed()
    assert [f.id for f in listed] == ids
    assert listed[0].row.value == big[:FAILED_VALUE_PREVIEW]
    assert listed[0].value_bytes == len(big)
    assert [(f.reason, f.held_behind, f.attempts) for f in listed[:3]] == [
        ("refused", None, 1),
        ("refused", None, 1),
        ("held", ids[0], 1),
    ]
    assert listed[1].row == rows[1]
    assert [f.id for f in operator.failed.list_failed("transfer")] == [ids[i] for i in (0, 1, 2, 4)]
    assert [f.id for f in operator.failed.list_failed("transfer", "a")] == [ids[0], ids[2]]
    assert [f.id for f in operator.failed.list_failed(limit=2)] == ids[:2]
    assert operator.failed.list_failed("wallet") == []


def test_a_retry_by_row_id_takes_the_whole_saga_back_whole_and_with_its_source(
    operator: Operator,
) -> None:
    big = b"v" * (FAILED_VALUE_PREVIEW + 5)
    rows = [row("a", 1, source=SOURCE), row("b", 1), row("a", 2, big, source=SOURCE)]
    ids = set_aside(operator, rows)

    back = operator.failed.retry_failed(row_id=ids[2])

    assert [f.id for f in back] == [ids[0], ids[2]]
    assert back[1].row.value == big[:FAILED_VALUE_PREVIEW]
    # The outbox gets the whole value back, under the row's own id, with its source.
    assert [(e.id, e.row) for e in operator.pending()] == [(ids[0], rows[0]), (ids[2], rows[2])]
    assert [f.id for f in operator.failed.list_failed()] == [ids[1]]
    assert operator.failed.retry_failed(row_id=ids[0]) == []


def test_a_discard_by_row_id_takes_that_row_alone(operator: Operator) -> None:
    ids = set_aside(operator, [row("a", 1), row("a", 2), row("a", 3)])

    gone = operator.failed.discard_failed(row_id=ids[1])

    assert [f.id for f in gone] == [ids[1]]
    assert [f.id for f in operator.failed.list_failed()] == [ids[0], ids[2]]
    assert operator.failed.discard_failed(row_id=ids[1]) == []
    assert operator.pending() == []


def test_a_row_of_no_saga_is_retried_alone(operator: Operator) -> None:
    ids = set_aside(operator, [row(None, 1), row(None, 2), row("a", 1)])
    audited = AuditEntry("ana", "outbox-retry", None, target={"row_id": ids[1]})

    back = operator.failed.retry_failed(row_id=ids[1], audit=audited)

    assert [f.id for f in back] == [ids[1]]
    assert [e.id for e in operator.pending()] == [ids[1]]
    assert [f.id for f in operator.failed.list_failed()] == [ids[0], ids[2]]
    [entry] = operator.audit()
    assert (entry.actor, entry.saga_type, entry.saga_id) == ("ana", None, None)
    assert entry.target == {"row_id": ids[1], "count": 1, "ids": [ids[1]]}
