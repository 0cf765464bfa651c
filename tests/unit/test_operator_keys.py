"""Per-operator keys: a record signed with a person's own key is theirs, whatever it claims."""

from __future__ import annotations

from processor._engine.decode import Operator, Rejected, decode
from processor._engine.plan import Item, Planner
from processor._engine.records import Record
from processor._invocation import bind_all
from processor._wire import OperatorAction, OperatorRecord
from tests.unit.test_plan import REG, Gate, OrderSaga

SHARED, ALICE = b"console-key", b"alice-key"


def _planner() -> Planner:
    sagas = bind_all([OrderSaga], dependencies={Gate: Gate()}, registry=REG)
    return Planner(
        sagas,
        registry=REG,
        dead_letter_topic="dl",
        operator_key=SHARED,
        operator_keys={"alice": ALICE},
    )


def _record(key: bytes, by: str) -> Operator:
    request = OperatorRecord(
        OperatorAction.CANCEL,
        "unit-order",
        "o1",
        command_id="c-1",
        by=by,
        reason="why",
        issued_at=1_777_626_000_000,
    )
    headers = tuple((k, v.encode()) for k, v in request.headers(key).items())
    record = Record("in", 0, 1, b"o1", request.value(), headers)
    decoded = decode(record, REG, 1 << 20)
    assert isinstance(decoded, Operator)
    return decoded


def test_a_persons_key_names_them_and_the_shared_key_keeps_the_name_it_was_given() -> None:
    planner = _planner()
    [mine], _ = planner.route([_record(ALICE, "mallory")])
    assert isinstance(mine, Item)
    assert isinstance(mine.decoded, Operator)
    assert mine.decoded.request.by == "alice"
    # The console signs with the shared key and names its signed-in user.
    [console], _ = planner.route([_record(SHARED, "olga")])
    assert isinstance(console, Item)
    assert isinstance(console.decoded, Operator)
    assert console.decoded.request.by == "olga"
    [forged], _ = planner.route([_record(b"guess", "alice")])
    assert isinstance(forged, Rejected)
    assert forged.detail == "bad or missing operator-auth"
