"""Signed operator records cannot be replayed: each expires, is decided once and must be in place.

A record's issued-at is inside its signed value and judged by the batch's (database) clock; a
record held behind a parked saga is judged when it arrives, not when a retry replays it. Its
message id is decided once whatever the outcome, so the bytes of a request that met no saga, or
was refused, do nothing when sent again. A record keyed other than its saga is dead-lettered.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from processor._engine.decode import Operator, Reason, Rejected, decode
from processor._engine.overlay import overlay
from processor._engine.plan import Planner
from processor._engine.records import Record
from processor._engine.rows import WriteSet
from processor._invocation import bind_all
from processor._memory.store import MemoryBatchStore
from processor._wire import OperatorAction, OperatorRecord
from tests.unit.test_plan import DEAD, NOW, REG, SAGA, Closed, Gate, Log, Opened, OrderSaga
from tests.unit.test_plan_retry import KEY, _parked, _planner

EXPIRY = timedelta(minutes=15)


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def _signed(
    log: Log,
    action: OperatorAction,
    command_id: str = "c1",
    *,
    issued: datetime | None = NOW,
    key: bytes | None = b"o1",
    name: str | None = None,
) -> Record:
    """The record `saga-processor saga ...` sends for saga o1, issued at ``issued``."""
    log.offset += 1
    req = OperatorRecord(
        action,
        SAGA,
        "o1",
        command_id,
        "ana",
        "customer asked",
        name,
        issued_at=_ms(issued) if issued is not None else None,
    )
    headers = tuple((k, v.encode()) for k, v in req.headers(KEY).items())
    return Record("in", 0, log.offset, key, req.value(), headers)


def _batch(
    planner: Planner, store: MemoryBatchStore, records: list[Record], now: datetime = NOW
) -> WriteSet:
    """Routes, loads, plans at ``now`` and writes one batch, as the consumer does."""
    items, wants = planner.route(decode(r, REG, 1 << 20) for r in records)
    ws = planner.plan(items, store.load(wants), now)
    store.write(ws, [])
    return ws


def _outcomes(ws: WriteSet) -> list[tuple[str, str]]:
    return [(h.message_id, h.outcome) for h in ws.history]


def _started(log: Log) -> tuple[Planner, MemoryBatchStore]:
    planner, store = _planner(Gate()), MemoryBatchStore(clock=lambda: NOW)
    _batch(planner, store, [log.event(Opened(order_id="o1"))])
    return planner, store


def _status(store: MemoryBatchStore) -> str | None:
    row = store.tables.sagas.get((SAGA, "o1"))
    return None if row is None else row.status


# -- expiry -------------------------------------------------------------------------------------


def test_a_request_older_than_the_expiry_is_refused_with_its_age_and_audited() -> None:
    log = Log()
    planner, store = _started(log)
    old = _signed(log, OperatorAction.TERMINATE, "c1", issued=NOW - EXPIRY - timedelta(minutes=1))
    ws = _batch(planner, store, [old])
    [h] = ws.history
    assert (h.message_id, h.outcome) == ("operator:c1", "operator-refused")
    assert h.detail == (
        "operator terminate by ana: customer asked "
        "(expired: issued 16m00s ago, the expiry is 15m00s)"
    )
    assert _status(store) == "active"
    assert [(a.action, a.outcome, a.actor) for a in ws.audit] == [
        ("terminate", "operator-refused", "ana")
    ]
    # At the expiry itself it is still fresh.
    _batch(planner, store, [_signed(log, OperatorAction.TERMINATE, "c2", issued=NOW - EXPIRY)])
    assert _status(store) == "ended"


def test_a_request_issued_ahead_of_the_clock_by_more_than_the_skew_is_refused() -> None:
    log = Log()
    planner, store = _started(log)
    ahead = _signed(log, OperatorAction.TERMINATE, "c1", issued=NOW + timedelta(minutes=2))
    [h] = _batch(planner, store, [ahead]).history
    assert h.outcome == "operator-refused"
    assert h.detail is not None
    assert "issued 2m00s ahead of the processor's clock" in h.detail
    assert "1m00s of clock skew allowed" in h.detail
    assert _status(store) == "active"
    # A sender's clock a little ahead is no reason to refuse.
    drift = _signed(log, OperatorAction.TERMINATE, "c2", issued=NOW + timedelta(seconds=30))
    assert _outcomes(_batch(planner, store, [drift])) == [("operator:c2", "applied")]


def test_a_request_without_an_issued_at_from_an_older_release_is_refused_as_expired() -> None:
    log = Log()
    planner, store = _started(log)
    legacy = _signed(log, OperatorAction.TERMINATE, issued=None)
    assert b"issued_at" not in (legacy.value or b"")
    ws = _batch(planner, store, [legacy])
    [h] = ws.history
    assert h.outcome == "operator-refused"
    assert h.detail is not None
    assert "expired: it has no issued-at (sent by an older release)" in h.detail
    assert [a.outcome for a in ws.audit] == ["operator-refused"]
    assert _status(store) == "active"


def test_the_expiry_is_the_planners_setting() -> None:
    log = Log()
    planner, store = _started(log)
    # Ten minutes old: fresh under the default, expired under a five-minute expiry.
    short = Planner(
        bind_all([OrderSaga], dependencies={Gate: Gate()}, registry=REG),
        registry=REG,
        dead_letter_topic=DEAD,
        operator_key=KEY,
        operator_expiry=timedelta(minutes=5),
    )
    aged = NOW - timedelta(minutes=10)
    [h] = _batch(short, store, [_signed(log, OperatorAction.TERMINATE, "c1", issued=aged)]).history
    assert h.detail is not None
    assert "expired: issued 10m00s ago, the expiry is 5m00s" in h.detail
    [h] = _batch(
        planner, store, [_signed(log, OperatorAction.TERMINATE, "c2", issued=aged)]
    ).history
    assert h.outcome == "applied"


def test_a_request_held_behind_a_parked_saga_does_not_expire_before_a_retry_replays_it() -> None:
    gate, store, log = Gate(), MemoryBatchStore(clock=lambda: NOW), Log()
    planner = _parked(gate, store, log)
    held = _batch(planner, store, [_signed(log, OperatorAction.TERMINATE, "t1")])
    assert _outcomes(held) == [("operator:t1", "parked-behind")]
    assert held.audit == []
    # An hour later the cause is fixed and a fresh retry replays what waited, the terminate too.
    later = NOW + timedelta(hours=1)
    retry = _signed(log, OperatorAction.PARKED_RETRY, "r1", issued=later)
    ws = _batch(planner, store, [retry], now=later)
    assert _outcomes(ws) == [
        ("operator:r1", "applied"),
        ("m-2", "applied"),
        ("m-3", "applied"),
        ("operator:t1", "applied"),
    ]
    assert _status(store) == "ended"
    assert [(a.action, a.outcome) for a in ws.audit] == [
        ("parked-retry", "applied"),
        ("terminate", "applied"),
    ]


def test_a_replay_by_the_retry_command_does_not_expire_held_requests() -> None:
    # `saga-processor parked retry` plans the held records with replay=True.
    log = Log()
    planner, store = _started(log)
    items, wants = planner.route(
        [decode(_signed(log, OperatorAction.TERMINATE, issued=NOW), REG, 1 << 20)]
    )
    later = NOW + timedelta(days=2)
    ws = planner.plan(items, store.load(wants), later, replay=True)
    assert _outcomes(ws) == [("operator:c1", "applied")]


# -- decided once -------------------------------------------------------------------------------


def test_a_request_that_met_no_saga_does_nothing_when_its_bytes_come_again() -> None:
    planner, store, log = _planner(Gate()), MemoryBatchStore(clock=lambda: NOW), Log()
    terminate = _signed(log, OperatorAction.TERMINATE)
    assert _outcomes(_batch(planner, store, [terminate])) == [("operator:c1", "no-saga")]
    _batch(planner, store, [log.event(Opened(order_id="o1"))])
    again = _batch(planner, store, [terminate])
    assert _outcomes(again) == [("operator:c1", "duplicate")]
    assert again.audit == []
    assert _status(store) == "active"
    assert [a.outcome for a in store.tables.audit.rows] == ["no-saga"]


@pytest.mark.parametrize(
    ("action", "name", "first"),
    [
        # Nothing waits for a decision: refused, and a copy is not decided again.
        (OperatorAction.RESOLVE, "skip", "operator-refused"),
        (OperatorAction.PARKED_RETRY, None, "operator-refused"),
    ],
)
def test_a_refused_request_is_a_duplicate_when_sent_again(
    action: OperatorAction, name: str | None, first: str
) -> None:
    log = Log()
    planner, store = _started(log)
    request = _signed(log, action, name=name)
    assert _outcomes(_batch(planner, store, [request])) == [("operator:c1", first)]
    assert _outcomes(_batch(planner, store, [request])) == [("operator:c1", "duplicate")]


def test_a_request_ignored_by_an_ended_saga_and_an_expired_one_are_decided_too() -> None:
    log = Log()
    planner, store = _started(log)
    _batch(planner, store, [log.event(Closed(order_id="o1"))])
    late = _signed(log, OperatorAction.TERMINATE, "c1")
    expired = _signed(log, OperatorAction.TERMINATE, "c2", issued=NOW - timedelta(hours=1))
    assert _outcomes(_batch(planner, store, [late, expired])) == [
        ("operator:c1", "ignored-ended"),
        ("operator:c2", "operator-refused"),
    ]
    assert _outcomes(_batch(planner, store, [late, expired])) == [
        ("operator:c1", "duplicate"),
        ("operator:c2", "duplicate"),
    ]


def test_a_copy_later_in_the_same_batch_is_a_duplicate() -> None:
    planner, store, log = _planner(Gate()), MemoryBatchStore(clock=lambda: NOW), Log()
    terminate = _signed(log, OperatorAction.TERMINATE)
    ws = _batch(planner, store, [terminate, log.event(Opened(order_id="o1")), terminate])
    assert _outcomes(ws) == [
        ("operator:c1", "no-saga"),
        ("m-2", "applied"),
        ("operator:c1", "duplicate"),
    ]
    assert _status(store) == "active"


def test_a_batch_planned_on_one_still_committing_sees_what_that_one_decided() -> None:
    planner, store, log = _planner(Gate()), MemoryBatchStore(clock=lambda: NOW), Log()
    _batch(planner, store, [log.event(Opened(order_id="o1"))])
    refused = _signed(log, OperatorAction.RESOLVE, name="skip")
    items, wants = planner.route([decode(refused, REG, 1 << 20)])
    prior = planner.plan(items, store.load(wants), NOW)
    assert _outcomes(prior) == [("operator:c1", "operator-refused")]
    # Not written yet: the next batch is planned on top of it.
    ws = planner.plan(items, overlay(store.load(wants), prior), NOW)
    assert _outcomes(ws) == [("operator:c1", "duplicate")]


def test_a_request_held_behind_a_parked_saga_is_not_decided_until_replayed() -> None:
    gate, store, log = Gate(), MemoryBatchStore(clock=lambda: NOW), Log()
    planner = _parked(gate, store, log)
    terminate = _signed(log, OperatorAction.TERMINATE, "t1")
    # Sent twice while the saga is parked: both wait; the replay applies one.
    assert _outcomes(_batch(planner, store, [terminate, terminate])) == [
        ("operator:t1", "parked-behind"),
        ("operator:t1", "parked-behind"),
    ]
    ws = _batch(planner, store, [_signed(log, OperatorAction.PARKED_RETRY, "r1")])
    assert [o for m, o in _outcomes(ws) if m == "operator:t1"] == ["applied", "duplicate"]


# -- where it arrives ---------------------------------------------------------------------------


@pytest.mark.parametrize("key", [b"o2", b"", None])
def test_a_request_keyed_other_than_its_saga_is_dead_lettered(key: bytes | None) -> None:
    log = Log()
    planner, store = _started(log)
    decoded = decode(_signed(log, OperatorAction.TERMINATE, key=key), REG, 1 << 20)
    assert isinstance(decoded, Operator)
    [rejected], wants = planner.route([decoded])
    assert isinstance(rejected, Rejected)
    assert (rejected.reason, rejected.detail) == (
        Reason.MISPLACED,
        "the record's key is not its saga id",
    )
    assert not wants.operator_keys
    ws = planner.plan([rejected], store.load(wants), NOW)
    assert [(d.reason, d.detail) for d in ws.dead_letters] == [
        ("misplaced", "the record's key is not its saga id")
    ]
    assert ws.history == []
