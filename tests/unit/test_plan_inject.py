"""`saga inject`: an operator's event, applied through the event step in the saga's log order."""

from __future__ import annotations

import json

import pytest

from processor._cli.inject import injected_value
from processor._engine.decode import injected
from processor._engine.records import Record
from processor._engine.rows import ENDED, PARKED, SagaRow
from processor._errors import SagaError
from processor._wire import OperatorAction, OperatorRecord
from tests.unit.test_plan import SAGA, Log, Noted, Opened, _active, _loaded, _outcomes, _plan
from tests.unit.test_plan_audit import ISSUED_AT, KEY, _planner


def _inject(
    log: Log,
    name: str,
    value: str,
    *,
    saga_id: str = "o1",
    command_id: str = "c1",
    issued_at: int = ISSUED_AT,
) -> Record:
    log.offset += 1
    req = OperatorRecord(
        OperatorAction.INJECT,
        SAGA,
        saga_id,
        command_id,
        "ana",
        "confirmed by phone",
        name,
        issued_at,
        message=value,
    )
    headers = tuple((k, v.encode()) for k, v in req.headers(KEY).items())
    return Record("in", 0, log.offset, saga_id.encode(), req.value(), headers)


NOTED = "unit.plan.Noted"


def test_the_record_signs_the_type_and_the_value_as_given() -> None:
    value = '{"order_id": "o1", "note": "1.10"}'
    req = OperatorRecord(OperatorAction.INJECT, SAGA, "o1", "c1", "ana", "r", NOTED, 1, value)
    body = json.loads(req.value())
    assert (body["action"], body["name"], body["message"]) == ("inject", NOTED, value)
    assert OperatorRecord.parse(req.value()) == req


def test_an_injected_event_runs_its_handler_as_if_it_had_arrived() -> None:
    log = Log()
    record = _inject(log, NOTED, Noted(order_id="o1", note="by-phone").model_dump_json())
    ws = _plan(_planner(), [record], _loaded(_active()))
    assert _outcomes(ws) == [("o1", "applied", 2)]
    [h] = ws.history
    assert (h.kind, h.message_type, h.message_id) == ("event", NOTED, "operator:c1")
    assert h.detail is not None
    assert h.detail.startswith("operator inject unit.plan.Noted by ana: confirmed by phone (")
    [ship] = ws.outbox
    assert ship.headers["causation-id"] == "operator:c1"
    assert json.loads(ship.value)["note"] == "by-phone"
    state = ws.sagas[0].state
    assert state is not None
    assert state["notes"] == ["by-phone"]
    [audit] = ws.audit
    assert (audit.actor, audit.action, audit.reason, audit.outcome) == (
        "ana",
        "inject",
        "confirmed by phone",
        "applied",
    )
    assert audit.target["name"] == NOTED


def test_the_same_request_sent_again_is_a_duplicate() -> None:
    log = Log()
    record = _inject(log, NOTED, Noted(order_id="o1", note="x").model_dump_json())
    ws = _plan(_planner(), [record, record], _loaded(_active()))
    assert [h.outcome for h in ws.history] == ["applied", "duplicate"]
    assert len(ws.outbox) == 1
    applied = {(SAGA, "o1", "operator:c1")}
    ws = _plan(_planner(), [record], _loaded(_active(), applied=applied))
    assert [h.outcome for h in ws.history] == ["duplicate"]
    assert not ws.outbox


def test_an_event_that_names_another_saga_is_refused() -> None:
    log = Log()
    record = _inject(log, NOTED, Noted(order_id="o2", note="x").model_dump_json())
    ws = _plan(_planner(), [record], _loaded(_active(), _active("o2")))
    assert [h.outcome for h in ws.history] == ["operator-refused"]
    assert "its order_id names another saga" in (ws.history[0].detail or "")
    assert not ws.outbox
    assert [a.outcome for a in ws.audit] == ["operator-refused"]


def test_an_unknown_type_or_an_invalid_value_is_refused_by_field_without_the_value() -> None:
    log = Log()
    records = [
        _inject(log, "unit.plan.Nope", "{}", command_id="c1"),
        _inject(log, NOTED, '{"order_id": "o1", "note": ["secret-7"]}', command_id="c2"),
    ]
    ws = _plan(_planner(), records, _loaded(_active()))
    assert [h.outcome for h in ws.history] == ["operator-refused", "operator-refused"]
    unknown, invalid = (h.detail or "" for h in ws.history)
    assert "no message type 'unit.plan.Nope' is registered" in unknown
    assert "note:" in invalid
    assert "secret-7" not in invalid
    assert not ws.outbox


def test_an_injected_event_waits_behind_a_parked_saga() -> None:
    log = Log()
    parked = SagaRow(SAGA, "o1", {"order_id": "o1", "notes": []}, PARKED, 3, "boom")
    record = _inject(log, NOTED, Noted(order_id="o1").model_dump_json())
    ws = _plan(_planner(), [record], _loaded(parked))
    assert [h.outcome for h in ws.history] == ["parked-behind"]
    assert [p.record for p in ws.parked] == [record]
    assert not ws.audit  # recorded when a retry replays it


def test_an_ended_saga_ignores_it_and_no_saga_is_recorded() -> None:
    log = Log()
    ended = SagaRow(SAGA, "o1", {"order_id": "o1", "notes": []}, ENDED, 4)
    records = [
        _inject(log, NOTED, Noted(order_id="o1").model_dump_json(), command_id="c1"),
        _inject(log, NOTED, Noted(order_id="zz").model_dump_json(), saga_id="zz", command_id="c2"),
    ]
    ws = _plan(_planner(), records, _loaded(ended))
    assert [(h.saga_id, h.outcome) for h in ws.history] == [
        ("o1", "ignored-ended"),
        ("zz", "no-saga"),
    ]
    assert [a.outcome for a in ws.audit] == ["ignored-ended", "no-saga"]


def test_an_injected_start_event_starts_the_saga() -> None:
    log = Log()
    record = _inject(log, "unit.plan.Opened", Opened(order_id="o9").model_dump_json(), saga_id="o9")
    ws = _plan(_planner(), [record], _loaded())
    assert _outcomes(ws) == [("o9", "applied", 1)]


def test_an_expired_injection_is_refused() -> None:
    log = Log()
    old = ISSUED_AT - 16 * 60 * 1000
    record = _inject(log, NOTED, Noted(order_id="o1").model_dump_json(), issued_at=old)
    ws = _plan(_planner(), [record], _loaded(_active()))
    assert [h.outcome for h in ws.history] == ["operator-refused"]
    assert "expired" in (ws.history[0].detail or "")


def test_the_command_line_validates_before_sending() -> None:
    from tests.unit.test_plan import REG

    assert isinstance(injected(REG, NOTED, '{"order_id": "o1"}'), Noted)
    assert injected(REG, NOTED, "{not json") == "the value is not valid JSON"
    # The CLI's own check, against the default registry: the transfer saga's messages.
    import schemas.transfers  # noqa: F401

    with pytest.raises(SagaError, match=r"no message type 'transfers\.Nope'"):
        injected_value("transfers.Nope", "{}")
    with pytest.raises(SagaError) as e:
        injected_value("transfers.DebitConfirmed", '{"transfer_id": ["t-secret"]}')
    assert "transfer_id" in str(e.value)
    assert "t-secret" not in str(e.value)
    assert "\n" not in str(e.value)


def test_the_saga_fixture_injects_through_the_operator_path() -> None:
    from decimal import Decimal

    from processor.testing import SagaFixture
    from sagas.transfer import PAYMENT_TIMEOUT, TransferSaga
    from schemas.transfers import CreditAccount, DebitConfirmed, TransferRequested

    amount = Decimal("25.00")
    fixture = SagaFixture(TransferSaga)
    fixture.given(
        TransferRequested(
            transfer_id="t-1", source_account_id="src", target_account_id="dst", amount=amount
        )
    )
    confirmed = DebitConfirmed(transfer_id="t-1", account_id="src", amount=amount)
    result = fixture.when_injected(confirmed, reason="confirmed by phone")
    result.expect_commands(CreditAccount(transfer_id="t-1", account_id="dst", amount=amount))
    result.expect_no_deadline(PAYMENT_TIMEOUT).expect_state(debit_confirmed=True)
    with pytest.raises(AssertionError, match="names another saga"):
        fixture.when_injected(DebitConfirmed(transfer_id="t-2", account_id="src", amount=amount))
