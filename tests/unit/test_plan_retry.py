"""An operator's `parked retry|skip` as a record in the saga's partition, planned in its batch."""

from __future__ import annotations

from processor._engine.decode import decode
from processor._engine.plan import Planner
from processor._engine.records import Record
from processor._engine.rows import PARKED, DeadlineRef, HeldMessage, Loaded, SagaRow, WriteSet
from processor._invocation import bind_all
from processor._memory.store import MemoryBatchStore
from processor._wire import OperatorAction, OperatorRecord
from tests.unit.test_plan import D1, DEAD, NOW, REG, SAGA, Gate, Log, Noted, Opened, OrderSaga

KEY = b"operator-key"
# Issued at the clock the batches are planned at: fresh.
ISSUED_AT = int(NOW.timestamp() * 1000)


def _planner(gate: Gate) -> Planner:
    sagas = bind_all([OrderSaga], dependencies={Gate: gate}, registry=REG)
    return Planner(sagas, registry=REG, dead_letter_topic=DEAD, operator_key=KEY)


def _request(log: Log, action: OperatorAction, command_id: str = "c1") -> Record:
    log.offset += 1
    req = OperatorRecord(
        action, SAGA, "o1", command_id, "ana", "fixed the ledger", issued_at=ISSUED_AT
    )
    headers = tuple((k, v.encode()) for k, v in req.headers(KEY).items())
    return Record("in", 0, log.offset, b"o1", req.value(), headers)


def _batch(planner: Planner, store: MemoryBatchStore, records: list[Record]) -> WriteSet:
    items, wants = planner.route(decode(r, REG, 1 << 20) for r in records)
    ws = planner.plan(items, store.load(wants), NOW)
    store.write(ws, [])
    return ws


def _parked(gate: Gate, store: MemoryBatchStore, log: Log) -> Planner:
    """o1 started, then parked on a failing note with a second note held behind it."""
    planner = _planner(gate)
    _batch(planner, store, [log.event(Opened(order_id="o1"))])
    gate.failures = 3  # every attempt of the next handler call
    _batch(
        planner,
        store,
        [log.event(Noted(order_id="o1", note="a")), log.event(Noted(order_id="o1", note="b"))],
    )
    assert store.tables.sagas[(SAGA, "o1")].status == "parked"
    assert len(store.tables.parked) == 2
    return planner


def _timeline(store: MemoryBatchStore) -> list[tuple[str, str, str | None]]:
    return [(h.message_id, h.outcome, h.detail) for h in store.tables.history]


def test_a_retry_replays_the_held_records_in_order_and_releases_them() -> None:
    gate, store, log = Gate(), MemoryBatchStore(clock=lambda: NOW), Log()
    planner = _parked(gate, store, log)
    history_before = len(store.tables.history)
    ws = _batch(planner, store, [_request(log, OperatorAction.PARKED_RETRY)])
    row = store.tables.sagas[(SAGA, "o1")]
    assert (row.status, row.state) == ("active", {"order_id": "o1", "notes": ["a", "b"]})
    assert store.tables.parked == []
    assert ws.wake_deadlines
    new = _timeline(store)[history_before:]
    assert new == [
        ("operator:c1", "applied", "operator parked-retry by ana: fixed the ledger"),
        ("m-2", "applied", "noted"),
        ("m-3", "applied", "noted"),
    ]
    # Versions stay contiguous: the unpark, then each replayed record.
    assert [h.version for h in store.tables.history[history_before:]] == [4, 5, 6]
    assert row.version == 6
    # The same request again (a redelivery) is a duplicate, not a second replay.
    _batch(planner, store, [_request(log, OperatorAction.PARKED_RETRY)])
    assert _timeline(store)[-1][:2] == ("operator:c1", "duplicate")


def test_a_retry_that_fails_again_changes_nothing_and_says_where() -> None:
    gate, store, log = Gate(), MemoryBatchStore(clock=lambda: NOW), Log()
    planner = _parked(gate, store, log)
    before = store.tables.sagas[(SAGA, "o1")]
    gate.failures = 3
    _batch(planner, store, [_request(log, OperatorAction.PARKED_RETRY)])
    after = store.tables.sagas[(SAGA, "o1")]
    assert (after.status, after.version, after.state) == ("parked", before.version, before.state)
    assert len(store.tables.parked) == 2
    message_id, outcome, detail = _timeline(store)[-1]
    assert (message_id, outcome) == ("operator:c1", "operator-refused")
    assert detail is not None
    assert "replay failed at m-2 (in[0]@2)" in detail
    assert "gate closed" in detail
    # Decided: the same request sent again once the cause is fixed is a duplicate; a new one
    # (the next `parked retry`) replays.
    gate.failures = 0
    _batch(planner, store, [_request(log, OperatorAction.PARKED_RETRY)])
    assert _timeline(store)[-1][:2] == ("operator:c1", "duplicate")
    assert store.tables.sagas[(SAGA, "o1")].status == "parked"
    _batch(planner, store, [_request(log, OperatorAction.PARKED_RETRY, "c2")])
    assert store.tables.sagas[(SAGA, "o1")].status == "active"


def test_a_skip_drops_the_failing_record_and_replays_the_rest() -> None:
    gate, store, log = Gate(), MemoryBatchStore(clock=lambda: NOW), Log()
    planner = _parked(gate, store, log)
    history_before = len(store.tables.history)
    _batch(planner, store, [_request(log, OperatorAction.PARKED_SKIP)])
    assert store.tables.sagas[(SAGA, "o1")].state == {"order_id": "o1", "notes": ["b"]}
    assert [(m, o) for m, o, _ in _timeline(store)[history_before:]] == [
        ("operator:c1", "applied"),
        ("m-2", "skipped"),
        ("m-3", "applied"),
    ]
    assert store.tables.parked == []


def test_a_retry_of_a_saga_that_is_not_parked_is_refused() -> None:
    gate, store, log = Gate(), MemoryBatchStore(clock=lambda: NOW), Log()
    planner = _planner(gate)
    _batch(planner, store, [log.event(Opened(order_id="o1"))])
    _batch(planner, store, [_request(log, OperatorAction.PARKED_RETRY)])
    message_id, outcome, detail = _timeline(store)[-1]
    assert (message_id, outcome) == ("operator:c1", "operator-refused")
    assert detail is not None
    assert "not parked" in detail


def test_a_retry_replays_records_held_earlier_in_the_same_batch_then_later_ones_flow() -> None:
    gate, store, log = Gate(failures=3), MemoryBatchStore(clock=lambda: NOW), Log()
    planner = _planner(gate)
    records = [
        log.event(Opened(order_id="o1")),  # fails three times: the saga parks on its start
        log.event(Noted(order_id="o1", note="a")),  # held behind it
        _request(log, OperatorAction.PARKED_RETRY),
        log.event(Noted(order_id="o1", note="b")),  # after the retry: applies directly
    ]
    ws = _batch(planner, store, records)
    row = store.tables.sagas[(SAGA, "o1")]
    assert (row.status, row.state) == ("active", {"order_id": "o1", "notes": ["a", "b"]})
    assert ws.parked == []
    assert store.tables.parked == []
    assert [(h.message_id, h.outcome) for h in ws.history] == [
        ("m-1", "parked"),
        ("m-2", "parked-behind"),
        ("operator:c1", "applied"),
        ("m-1", "applied"),
        ("m-2", "applied"),
        ("m-4", "applied"),
    ]


def test_a_skipped_fired_deadline_is_consumed_not_left_dispatched() -> None:
    log = Log()
    planner = _planner(Gate())
    fired = log.fired(D1, 7)
    held = HeldMessage(1, fired)
    row = SagaRow(SAGA, "o1", {"order_id": "o1", "notes": []}, PARKED, 3, "remind failed")
    ref = DeadlineRef(SAGA, "o1", "remind", NOW, None, 7)
    loaded = Loaded(
        sagas={(SAGA, "o1"): row},
        applied=set(),
        deadlines={D1: ref},
        lease_token=8,  # the lease moved on while the saga was parked
        now=NOW,
        held={(SAGA, "o1"): [held]},
    )
    items, _ = planner.route([decode(_request(log, OperatorAction.PARKED_SKIP), REG, 1 << 20)])
    ws = planner.plan(items, loaded, NOW)
    assert [(h.message_id, h.outcome) for h in ws.history] == [
        ("operator:c1", "applied"),
        (f"deadline:{D1}", "skipped"),
    ]
    assert ws.deadline_deletes == [(SAGA, "o1", "remind")]
    assert ws.held_releases == [1]


def test_a_skipped_fired_deadline_leaves_a_later_deadline_of_the_same_name() -> None:
    log = Log()
    planner = _planner(Gate())
    held = HeldMessage(1, log.fired(D1, 7))
    row = SagaRow(SAGA, "o1", {"order_id": "o1", "notes": []}, PARKED, 3, "remind failed")
    loaded = Loaded(
        sagas={(SAGA, "o1"): row},
        applied=set(),
        deadlines={},  # the fired row is gone (cancelled and scheduled anew under another id)
        lease_token=8,
        now=NOW,
        held={(SAGA, "o1"): [held]},
    )
    items, _ = planner.route([decode(_request(log, OperatorAction.PARKED_SKIP), REG, 1 << 20)])
    ws = planner.plan(items, loaded, NOW)
    assert ws.deadline_deletes == []
