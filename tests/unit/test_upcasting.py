"""Versioned saga state and message evolution: upcasters, and records newer than the code."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from pydantic import Field

from processor import (
    ConfigurationError,
    Message,
    SagaCommands,
    SagaDefinitionError,
    SagaState,
    event_upcaster,
    message_type,
    saga,
    saga_event_handler,
    upcaster,
)
from processor._authoring.messages import MessageRegistry
from processor._authoring.upcasting import MissingUpcaster, StateUpcasters
from processor._engine.decode import Event, Reason, Rejected, TooNew, decode
from processor._engine.plan import Item, Planner
from processor._engine.records import Record
from processor._engine.rows import ACTIVE, PARKED, Loaded, Outcome, SagaRow
from processor._invocation import bind, bind_all
from processor.testing import SagaFixture

NOW = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
LIMIT = 1 << 20


@message_type("unit.upcast.Opened")
class Opened(Message):
    account_id: str
    amount: Decimal


@message_type("unit.upcast.Topped")
class Topped(Message):
    account_id: str
    amount: Decimal


@message_type("unit.upcast.Note", topic="notes")
class Note(Message):
    account_id: str
    text: str


# Version 1 stored {"account": str, "balance": str (decimal), "legacy_flag": bool}.
# Version 2: "account" renamed to "account_id", "legacy_flag" removed, "balance_minor" added
# (computed from the balance).
@saga(type="unit-upcast-account", version=2)
class AccountV2(SagaState):
    account_id: str = ""
    balance: Decimal = Decimal(0)
    balance_minor: int = 0

    @saga_event_handler(Opened, association_property="account_id", start=True)
    def opened(self, event: Opened) -> None:
        self.account_id = event.account_id
        self.balance = event.amount
        self.balance_minor = int(event.amount * 100)

    @saga_event_handler(Topped, association_property="account_id")
    def topped(self, event: Topped, commands: SagaCommands) -> None:
        self.balance += event.amount
        self.balance_minor = int(self.balance * 100)
        commands.send(Note(account_id=self.account_id, text=str(self.balance)))


@upcaster(AccountV2, from_version=1)
def _account_v1_to_v2(state: dict[str, Any]) -> dict[str, Any]:
    state["account_id"] = state.pop("account")
    state.pop("legacy_flag", None)
    state["balance_minor"] = int(Decimal(state["balance"]) * 100)
    return state


V1_STATE = {"account": "a-1", "balance": "12.50", "legacy_flag": True}


def test_a_stored_v1_state_is_upcast_on_load_and_written_back_at_v2() -> None:
    fixture = SagaFixture(AccountV2).given_stored_state(V1_STATE, version=1, saga_id="a-1")
    fixture.when(Topped(account_id="a-1", amount=Decimal("1.00"))).expect_state(
        account_id="a-1", balance=Decimal("13.50"), balance_minor=1350
    ).expect_commands(Note(account_id="a-1", text="13.50"))
    row = fixture._engine.store.tables.sagas[("unit-upcast-account", "a-1")]
    assert row.state_version == 2
    assert row.state is not None
    assert "account" not in row.state
    assert "legacy_flag" not in row.state


def test_a_state_without_an_upcaster_for_its_version_does_not_load() -> None:
    fixture = SagaFixture(AccountV2).given_stored_state(V1_STATE, version=0, saga_id="a-1")
    with pytest.raises(AssertionError, match=r"no upcaster from v0.*unit-upcast-account"):
        fixture.when(Topped(account_id="a-1", amount=Decimal("1.00")))


def test_a_state_newer_than_the_code_parks_with_a_roll_forward_reason() -> None:
    fixture = SagaFixture(AccountV2).given_stored_state(
        {"account_id": "a-1"}, version=3, saga_id="a-1"
    )
    with pytest.raises(AssertionError, match=r"stored state is v3, newer than this code's v2"):
        fixture.when(Topped(account_id="a-1", amount=Decimal("1.00")))


def test_the_chain_applies_in_order_and_leaves_the_input_alone() -> None:
    reg = StateUpcasters()
    reg.add("s", 1, lambda d: {**d, "steps": [*d["steps"], 1]})
    reg.add("s", 2, lambda d: {**d, "steps": [*d["steps"], 2]})
    stored = {"steps": [0]}
    assert reg.apply("s", stored, 1, 3) == {"steps": [0, 1, 2]}
    assert reg.apply("s", stored, 2, 3) == {"steps": [0, 2]}
    assert stored == {"steps": [0]}
    with pytest.raises(MissingUpcaster, match="no upcaster from v3"):
        reg.apply("s", stored, 3, 4)


def test_binding_refuses_a_chain_with_a_gap_or_past_the_version() -> None:
    reg = StateUpcasters()
    reg.add("s", 1, lambda d: d)
    reg.add("s", 3, lambda d: d)
    assert reg.problems("s", 4) == ["no upcaster from v2: the chain from v1 to v4 has a gap"]
    assert reg.problems("s", 2) == ["upcaster from v3 is at or past the saga's version v2"]
    assert StateUpcasters().problems("s", 5) == []  # old rows are check's business
    reg2 = StateUpcasters()
    reg2.add("unit-upcast-account", 1, lambda d: d)
    reg2.add("unit-upcast-account", 2, lambda d: d)
    with pytest.raises(ConfigurationError, match="upcaster from v2 is at or past"):
        bind(AccountV2, upcasters=reg2)


def test_two_upcasters_for_one_version_are_refused() -> None:
    reg = StateUpcasters()
    reg.add("s", 1, lambda d: d)
    with pytest.raises(SagaDefinitionError, match="already has an upcaster from v1"):
        reg.add("s", 1, lambda d: d)


def test_the_state_version_must_be_a_positive_integer() -> None:
    with pytest.raises(SagaDefinitionError, match="state version must be an integer"):

        @saga(type="unit-upcast-bad", version=0)
        class Bad(SagaState):
            x: int = 0

            @saga_event_handler(Opened, association_property="account_id", start=True)
            def opened(self, event: Opened) -> None: ...


# -- events ------------------------------------------------------------------------------------

REG = MessageRegistry()


@message_type("unit.upcast.Paid", version=2, registry=REG)
class PaidV2(Message):
    order_id: str
    amount_minor: int


@event_upcaster("unit.upcast.Paid", from_version=1, registry=REG)
def _paid_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    return {"order_id": data["order"], "amount_minor": int(Decimal(data["amount"]) * 100)}


@saga(type="unit-upcast-order")
class OrderSaga(SagaState):
    paid: list[int] = Field(default_factory=list)

    @saga_event_handler(PaidV2, association_property="order_id", start=True)
    def on_paid(self, event: PaidV2) -> None:
        self.paid.append(event.amount_minor)


def _record(version: int, body: dict[str, Any], key: str = "o-1", offset: int = 1) -> Record:
    headers = (
        ("message-id", f"m-{offset}".encode()),
        ("message-type", b"unit.upcast.Paid"),
        ("schema-version", str(version).encode()),
    )
    return Record("in", 0, offset, key.encode(), json.dumps(body).encode(), headers)


def test_an_older_event_is_upcast_before_validation() -> None:
    out = decode(_record(1, {"order": "o-1", "amount": "2.5"}), REG, LIMIT)
    assert isinstance(out, Event)
    assert out.message == PaidV2(order_id="o-1", amount_minor=250)


def test_an_older_event_whose_upcast_does_not_validate_is_a_schema_violation() -> None:
    out = decode(_record(1, {"order": "o-1", "amount": "x"}), REG, LIMIT)
    assert isinstance(out, Rejected)
    assert out.reason is Reason.SCHEMA_VIOLATION
    assert "upcaster" in out.detail


def test_a_newer_event_is_decoded_as_too_new_not_rejected() -> None:
    out = decode(_record(3, {"order_id": "o-1", "cents": 5}), REG, LIMIT)
    assert isinstance(out, TooNew)
    assert (out.version, out.known, out.metadata.message_id) == (3, 2, "m-1")


def _planner() -> Planner:
    return Planner(bind_all([OrderSaga], registry=REG), registry=REG, dead_letter_topic="dl")


def _loaded(rows: dict[tuple[str, str], SagaRow] | None = None) -> Loaded:
    return Loaded(rows or {}, set(), {}, None, NOW)


def test_a_newer_event_parks_its_saga_and_later_events_wait_behind_it() -> None:
    planner = _planner()
    records = [
        _record(3, {"order_id": "o-1", "cents": 5}, offset=1),
        _record(2, {"order_id": "o-1", "amount_minor": 7}, offset=2),
        _record(2, {"order_id": "o-2", "amount_minor": 9}, offset=3),
    ]
    items, _ = planner.route([decode(r, REG, LIMIT) for r in records])
    assert [i.saga_id for i in items if isinstance(i, Item)] == ["o-1", "o-1", "o-2"]
    row = SagaRow("unit-upcast-order", "o-1", {"paid": [1]}, ACTIVE, 4)
    ws = planner.plan(items, _loaded({("unit-upcast-order", "o-1"): row}), NOW)
    assert not ws.dead_letters
    assert [(p.saga_id, p.record.offset) for p in ws.parked] == [("o-1", 1), ("o-1", 2)]
    assert "schema-version 3 is newer than this code knows (v2)" in ws.parked[0].reason
    assert [h.outcome for h in ws.history] == [
        Outcome.PARKED,
        Outcome.PARKED_BEHIND,
        Outcome.APPLIED,
    ]
    written = {s.saga_id: s for s in ws.sagas}
    assert written["o-1"].status == PARKED
    assert written["o-1"].state == {"paid": [1]}
    assert written["o-2"].status == ACTIVE


def test_a_newer_event_is_routed_by_the_record_key_when_the_field_is_gone() -> None:
    planner = _planner()
    items, _ = planner.route([decode(_record(3, {"order_ref": "x"}, key="o-9"), REG, LIMIT)])
    assert [i.saga_id for i in items if isinstance(i, Item)] == ["o-9"]


def test_a_newer_event_for_no_saga_yet_parks_a_stateless_row() -> None:
    planner = _planner()
    items, _ = planner.route([decode(_record(3, {"order_id": "o-5"}), REG, LIMIT)])
    ws = planner.plan(items, _loaded(), NOW)
    assert [(s.saga_id, s.status, s.state) for s in ws.sagas] == [("o-5", PARKED, None)]
