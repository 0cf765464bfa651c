"""An operator's replay is never planned on top of a batch still committing.

A parked saga's held records are loaded with their row ids, so that the replay can release
them. Planned on top of a batch in flight that holds one more record behind the saga, the replay
found none of them (the overlay of a prior batch dropped them) and unparked the saga without
replaying anything: the held records were left behind, never applied.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from processor._engine.plan import Planner
from processor._engine.records import OffsetCommit, Record
from processor._engine.rows import Outcome, WriteSet
from processor._errors import RecordDataError
from processor._invocation import bind_all
from processor._memory.consumer import MemoryRecordConsumer
from processor._memory.store import MemoryBatchStore, MemoryTables
from processor._runtime.consumer.worker import Worker
from processor._runtime.hooks import Hooks
from processor._wire import OperatorAction
from tests.unit.test_plan import DEAD, NOW, REG, SAGA, Gate, Log, Noted, Opened, OrderSaga
from tests.unit.test_plan_retry import KEY, _request

TOPIC = "in"


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def parts(gate: Gate) -> Iterator[tuple[Worker, MemoryRecordConsumer, MemoryTables, Hooks]]:
    sagas = bind_all([OrderSaga], dependencies={Gate: gate}, registry=REG)
    planner = Planner(sagas, registry=REG, dead_letter_topic=DEAD, operator_key=KEY)
    tables = MemoryTables()
    hooks = Hooks()
    worker = Worker(
        # The operator records are issued at NOW: so is the database's clock here.
        store=MemoryBatchStore(tables, clock=lambda: NOW),
        control=MemoryBatchStore(tables, clock=lambda: NOW),
        planner=planner,
        registry=REG,
        owner="me",
        consumer=MemoryRecordConsumer,
        max_record_bytes=1 << 20,
        batch_size=100,
        batch_timeout=0.0,
        hooks=hooks,
    )
    consumer = worker.consumer
    assert isinstance(consumer, MemoryRecordConsumer)
    try:
        yield worker, consumer, tables, hooks
    finally:
        worker.close()


def _send(consumer: MemoryRecordConsumer, record: Record) -> None:
    consumer.append(TOPIC, 0, record.value, key=record.key, headers=record.headers)


def test_a_replay_waits_for_the_batch_in_flight_and_replays_every_held_record(
    parts: tuple[Worker, MemoryRecordConsumer, MemoryTables, Hooks], gate: Gate
) -> None:
    worker, consumer, tables, hooks = parts
    log = Log()
    consumer.assign([(TOPIC, 0)])
    _send(consumer, log.event(Opened(order_id="o1")))
    worker.poll_once()
    worker.settle()
    gate.failures = 3  # every attempt of the next handler call
    _send(consumer, log.event(Noted(order_id="o1", note="a")))
    worker.poll_once()
    worker.settle()
    assert tables.sagas[(SAGA, "o1")].status == "parked"
    gate.failures = 0  # the fix is deployed

    replay_planned = threading.Event()
    writes = 0

    def hold_the_held_batch() -> None:
        # The batch that holds "b" behind the saga stays in flight until the replay was
        # planned, or half a second: planned on top of it is what must not happen.
        nonlocal writes
        writes += 1
        if writes == 1:
            replay_planned.wait(0.5)

    plans = 0

    def note_plan() -> None:
        nonlocal plans
        plans += 1
        if plans == 2:
            replay_planned.set()

    hooks.on("before-commit", hold_the_held_batch)
    hooks.on("before-write", note_plan)
    _send(consumer, log.event(Noted(order_id="o1", note="b")))
    worker.poll_once()  # "b" is held behind the parked saga; its batch is in flight
    _send(consumer, _request(log, OperatorAction.PARKED_RETRY))
    worker.poll_once()
    worker.settle()

    row = tables.sagas[(SAGA, "o1")]
    assert (row.status, row.state) == ("active", {"order_id": "o1", "notes": ["a", "b"]})
    assert tables.parked == []


class _Refusing(MemoryBatchStore):
    """Refuses, as a database constraint would, any write that applies ``refused`` message ids."""

    def __init__(self, tables: MemoryTables) -> None:
        super().__init__(tables, clock=lambda: NOW)
        self.refused: set[str] = set()

    def write(self, ws: WriteSet, offsets: Sequence[OffsetCommit], **kw: Any) -> None:
        if any(h.message_id in self.refused and h.outcome is Outcome.APPLIED for h in ws.history):
            raise RecordDataError("23514", 'new row violates check constraint "no_notes"')
        super().write(ws, offsets, **kw)


def test_a_saga_the_database_refuses_is_parked_and_a_retry_refused_again_leaves_it_so(
    gate: Gate,
) -> None:
    sagas = bind_all([OrderSaga], dependencies={Gate: gate}, registry=REG)
    planner = Planner(sagas, registry=REG, dead_letter_topic=DEAD, operator_key=KEY)
    tables = MemoryTables()
    store = _Refusing(tables)
    worker = Worker(
        store=store,
        control=store,
        planner=planner,
        registry=REG,
        owner="me",
        consumer=MemoryRecordConsumer,
        max_record_bytes=1 << 20,
        batch_size=100,
        batch_timeout=0.0,
    )
    consumer = worker.consumer
    assert isinstance(consumer, MemoryRecordConsumer)
    log = Log()
    try:
        consumer.assign([(TOPIC, 0)])
        _send(consumer, log.event(Opened(order_id="o1")))  # offset 0
        worker.poll_once()
        worker.settle()
        store.refused = {"m-2"}
        _send(consumer, log.event(Noted(order_id="o1", note="a")))  # offset 1
        for _ in range(3):
            worker.poll_once()
            worker.settle()
        row = tables.sagas[(SAGA, "o1")]
        assert row.status == "parked"
        assert row.parked_reason is not None
        assert row.parked_reason.startswith("the database refused its writes (23514: ")
        assert [p.record.offset for p in tables.parked] == [1]

        # A retry before the cause is fixed: refused again, the saga stays parked as it was
        # (its held records unchanged), and the request is dead-lettered with the reason.
        _send(consumer, _request(log, OperatorAction.PARKED_RETRY, "c1"))  # offset 2
        for _ in range(3):
            worker.poll_once()
            worker.settle()
        assert tables.sagas[(SAGA, "o1")].status == "parked"
        assert [p.record.offset for p in tables.parked] == [1]
        [letter] = tables.dead_letters
        assert (letter.record.offset, letter.reason) == (2, "refused-by-database")

        store.refused = set()  # the constraint is fixed
        _send(consumer, _request(log, OperatorAction.PARKED_RETRY, "c2"))
        for _ in range(3):
            worker.poll_once()
            worker.settle()
        assert tables.sagas[(SAGA, "o1")].status == "active"
        assert tables.parked == []
        assert tables.offsets[(TOPIC, 0)][1] == 4
    finally:
        worker.close()
