"""The audit trail of operator records: one entry per decided request, in the batch deciding it."""

from __future__ import annotations

from typing import Any

from processor._engine.rows import AuditEntry
from processor._memory.store import MemoryBatchStore
from processor._wire import OperatorAction
from tests.unit.test_plan import NOW, SAGA, Gate, Log, Opened
from tests.unit.test_plan_retry import _batch, _parked, _planner, _request


def _entries(store: MemoryBatchStore) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(action, outcome, actor, target) of each stored entry, in the order recorded."""
    return [(a.action, a.outcome, a.actor, a.target) for a in store.tables.audit.rows]


def test_a_skip_is_recorded_once_with_the_message_it_dropped() -> None:
    gate, store, log = Gate(), MemoryBatchStore(clock=lambda: NOW), Log()
    planner = _parked(gate, store, log)
    ws = _batch(planner, store, [_request(log, OperatorAction.PARKED_SKIP)])
    assert ws.audit == [
        AuditEntry(
            "ana",
            "parked-skip",
            "fixed the ledger",
            SAGA,
            "o1",
            {"request": "operator:c1", "version": 4, "skipped": ["m-2"]},
            "applied",
        )
    ]
    # Redelivered: a duplicate that decides nothing and records nothing more.
    again = _batch(planner, store, [_request(log, OperatorAction.PARKED_SKIP)])
    assert again.audit == []
    assert [e[:2] for e in _entries(store)] == [("parked-skip", "applied")]


def test_a_refused_request_is_recorded_with_its_outcome() -> None:
    gate, store, log = Gate(), MemoryBatchStore(clock=lambda: NOW), Log()
    planner = _parked(gate, store, log)
    gate.failures = 3
    _batch(planner, store, [_request(log, OperatorAction.PARKED_RETRY)])
    assert _entries(store) == [
        ("parked-retry", "operator-refused", "ana", {"request": "operator:c1"})
    ]


def test_a_terminate_held_behind_a_parked_saga_is_recorded_when_a_skip_replays_it() -> None:
    gate, store, log = Gate(), MemoryBatchStore(clock=lambda: NOW), Log()
    planner = _parked(gate, store, log)
    _batch(planner, store, [_request(log, OperatorAction.TERMINATE, "t1")])
    assert _entries(store) == []  # held behind the parked saga: not decided yet
    _batch(planner, store, [_request(log, OperatorAction.PARKED_SKIP, "s1")])
    # The skip first: it caused the replay that applied the terminate.
    assert _entries(store) == [
        (
            "parked-skip",
            "applied",
            "ana",
            {"request": "operator:s1", "version": 5, "skipped": ["m-2"]},
        ),
        ("terminate", "applied", "ana", {"request": "operator:t1", "version": 7}),
    ]
    assert store.tables.sagas[(SAGA, "o1")].status == "ended"


def test_a_terminate_of_a_running_saga_is_recorded_and_listed_by_saga() -> None:
    gate, store, log = Gate(), MemoryBatchStore(clock=lambda: NOW), Log()
    planner = _planner(gate)
    _batch(planner, store, [log.event(Opened(order_id="o1"))])
    _batch(planner, store, [_request(log, OperatorAction.TERMINATE)])
    assert _entries(store) == [
        ("terminate", "applied", "ana", {"request": "operator:c1", "version": 2})
    ]
    [row] = store.tables.audit.audit(saga_type=SAGA, saga_id="o1")
    assert (row.reason, row.at) == ("fixed the ledger", NOW)
    assert store.tables.audit.audit(saga_id="other") == []
