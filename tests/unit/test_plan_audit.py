"""The audit trail the planner records, and operator records applied in the saga's log order."""

from __future__ import annotations

import hashlib
from typing import Literal

import pytest

from processor._engine.decode import Operator, Reason, Rejected, decode
from processor._engine.plan import Planner
from processor._engine.records import Record
from processor._engine.rows import ENDED, PARKED, SagaRow
from processor._invocation import bind_all
from processor._wire import OperatorAction, OperatorRecord
from tests.unit.test_plan import (
    DEAD,
    NOW,
    REG,
    SAGA,
    Gate,
    Log,
    Noted,
    Opened,
    OrderSaga,
    _active,
    _loaded,
    _outcomes,
    _plan,
)

KEY = b"operator-key"
ISSUED_AT = int(NOW.timestamp() * 1000)


def _planner(
    payload: Literal["full", "hashed", "off"] = "full", key: bytes | None = KEY
) -> Planner:
    sagas = bind_all([OrderSaga], dependencies={Gate: Gate()}, registry=REG)
    return Planner(
        sagas,
        registry=REG,
        dead_letter_topic=DEAD,
        history_payload=payload,
        operator_key=key,
    )


def _operator(
    log: Log,
    action: OperatorAction,
    *,
    saga_id: str = "o1",
    name: str | None = None,
    key: bytes = KEY,
    command_id: str = "c1",
) -> Record:
    log.offset += 1
    req = OperatorRecord(
        action, SAGA, saga_id, command_id, "ana", "customer asked", name, ISSUED_AT
    )
    headers = tuple((k, v.encode()) for k, v in req.headers(key).items())
    return Record("in", 0, log.offset, saga_id.encode(), req.value(), headers)


def test_full_history_keeps_the_records_own_bytes_headers_and_effects() -> None:
    log = Log()
    records = [log.event(Opened(order_id="o1")), log.event(Noted(order_id="o1", note="a"))]
    ws = _plan(_planner(), records, _loaded())
    opened, noted = ws.history
    # The very bytes object the record carried: nothing was serialised again.
    assert opened.payload is records[0].value
    assert opened.headers is not None
    assert opened.headers["message-type"] == "unit.plan.Opened"
    assert opened.effects is not None
    [schedule] = opened.effects["deadlines"]
    assert (schedule["op"], schedule["name"]) == ("schedule", "remind")
    assert schedule["id"] == ws.deadline_inserts[0].id
    assert noted.effects is not None
    [command] = noted.effects["commands"]
    assert command["message_id"] == ws.outbox[0].headers["message-id"]
    assert command["type"] == "unit.plan.Ship"


def test_hashed_history_keeps_the_digest_only_and_off_keeps_neither() -> None:
    log = Log()
    record = log.event(Opened(order_id="o1"))
    [hashed] = _plan(_planner("hashed"), [record], _loaded()).history
    assert hashed.payload is None
    assert hashed.payload_sha256 == hashlib.sha256(record.value or b"").digest()
    assert hashed.headers is not None
    [off] = _plan(_planner("off"), [record], _loaded()).history
    assert (off.payload, off.payload_sha256, off.headers) == (None, None, None)
    # What the step produced is kept in every mode.
    assert off.effects is not None
    assert off.effects["deadlines"][0]["name"] == "remind"


def test_an_operator_terminate_ends_a_plain_saga_and_names_who_and_why() -> None:
    log = Log()
    ws = _plan(_planner(), [_operator(log, OperatorAction.TERMINATE)], _loaded(_active()))
    assert _outcomes(ws) == [("o1", "applied", 2)]
    [h] = ws.history
    assert (h.kind, h.message_type, h.message_id) == (
        "operator",
        "operator:terminate",
        "operator:c1",
    )
    assert h.detail == "operator terminate by ana (no compensation ran): customer asked"
    assert ws.sagas[0].status == ENDED
    assert ws.deadline_clears == [(SAGA, "o1")]


def test_cancel_is_refused_for_a_saga_without_a_cancel_path() -> None:
    log = Log()
    ws = _plan(_planner(), [_operator(log, OperatorAction.CANCEL)], _loaded(_active()))
    [h] = ws.history
    assert h.outcome == "operator-refused"
    assert h.detail is not None
    assert "declares no cancel path" in h.detail
    assert "terminate --force" in h.detail
    assert ws.sagas == []


def test_an_operator_record_is_ordered_with_the_sagas_events() -> None:
    # A reply that lands before the terminate applies first; the terminate then ends the saga
    # and a reply after it is ignored: one log, one order.
    log = Log()
    records = [
        log.event(Noted(order_id="o1", note="a")),
        _operator(log, OperatorAction.TERMINATE),
        log.event(Noted(order_id="o1", note="b")),
    ]
    ws = _plan(_planner(), records, _loaded(_active()))
    assert _outcomes(ws) == [
        ("o1", "applied", 2),
        ("o1", "applied", 3),
        ("o1", "ignored-ended", None),
    ]


def test_an_operator_record_sent_twice_is_a_duplicate() -> None:
    log = Log()
    records = [
        _operator(log, OperatorAction.TERMINATE),
        _operator(log, OperatorAction.TERMINATE),
    ]
    ws = _plan(_planner(), records, _loaded(_active()))
    assert [h.outcome for h in ws.history] == ["applied", "duplicate"]
    applied = {(SAGA, "o1", "operator:c1")}
    ws = _plan(_planner(), records[:1], _loaded(_active(), applied=applied))
    assert [h.outcome for h in ws.history] == ["duplicate"]


@pytest.mark.parametrize("key", [None, b"another key"])
def test_an_operator_record_without_the_processors_key_is_dead_lettered(
    key: bytes | None,
) -> None:
    log = Log()
    record = _operator(log, OperatorAction.CANCEL, key=b"forged")
    items, wants = _planner(key=key).route([decode(record, REG, 1 << 20)])
    [rejected] = items
    assert isinstance(rejected, Rejected)
    assert rejected.reason == Reason.UNAUTHENTICATED
    assert not wants.saga_keys


def test_a_tampered_operator_record_is_refused() -> None:
    log = Log()
    record = _operator(log, OperatorAction.CANCEL)
    tampered = Record(
        record.topic,
        record.partition,
        record.offset,
        record.key,
        (record.value or b"").replace(b"o1", b"o2"),
        record.headers,
    )
    decoded = decode(tampered, REG, 1 << 20)
    assert isinstance(decoded, Operator)
    [item], _ = _planner().route([decoded])
    assert isinstance(item, Rejected)


def test_deadline_actions_by_name() -> None:
    log = Log()
    records = [
        _operator(log, OperatorAction.DEADLINE_FIRE_NOW, name="remind", command_id="c1"),
        _operator(log, OperatorAction.DEADLINE_CANCEL, name="remind", command_id="c2"),
    ]
    ws = _plan(_planner(), records, _loaded(_active()))
    assert _outcomes(ws) == [("o1", "applied", 2), ("o1", "applied", 3)]
    assert ws.deadline_fire_now == [(SAGA, "o1", "remind")]
    assert ws.wake_deadlines
    assert ws.deadline_deletes == [(SAGA, "o1", "remind")]


def test_an_operator_record_waits_behind_a_parked_saga() -> None:
    log = Log()
    parked = SagaRow(SAGA, "o1", {"order_id": "o1", "notes": []}, PARKED, 3, "boom")
    ws = _plan(_planner(), [_operator(log, OperatorAction.CANCEL)], _loaded(parked))
    assert [h.outcome for h in ws.history] == ["parked-behind"]
    assert len(ws.parked) == 1


def test_an_operator_record_for_no_saga_is_recorded() -> None:
    log = Log()
    ws = _plan(_planner(), [_operator(log, OperatorAction.CANCEL, saga_id="zz")], _loaded())
    assert [h.outcome for h in ws.history] == ["no-saga"]
    assert not ws.sagas
