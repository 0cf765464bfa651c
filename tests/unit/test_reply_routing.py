"""Replies routed by their saga-type header: two saga types on one reply type, and strangers."""

from __future__ import annotations

import dataclasses
from collections import Counter

from processor import Message, SagaState, message_type, saga, saga_event_handler
from processor._engine.decode import decode
from processor._engine.plan import Item, Planner
from processor._engine.rows import ACTIVE, Outcome, SagaRow
from processor._invocation import bind_all
from processor._runtime.consumer.batch import Batch, Owned
from tests.unit.test_plan import REG, Log, Noted, _loaded

OTHER = "unit-refund"
MINE = "unit-billing"


@message_type("unit.routing.PaymentCaptured", registry=REG)
class PaymentCaptured(Message):
    order_id: str


@saga(type=MINE)
class BillingSaga(SagaState):
    captures: int = 0

    @saga_event_handler(Noted, association_property="order_id", start=True)
    def noted(self, event: Noted) -> None:
        """Starts it."""

    @saga_event_handler(PaymentCaptured, association_property="order_id")
    def captured(self, event: PaymentCaptured) -> None:
        self.captures += 1


@saga(type=OTHER)
class RefundSaga(SagaState):
    captures: int = 0

    @saga_event_handler(Noted, association_property="order_id", start=True)
    def noted(self, event: Noted) -> None:
        """Starts it."""

    @saga_event_handler(PaymentCaptured, association_property="order_id")
    def captured(self, event: PaymentCaptured) -> None:
        self.captures += 1


def _reply(log: Log, saga_type: str | None) -> object:
    record = log.event(PaymentCaptured(order_id="o1"))
    if saga_type is not None:
        record = dataclasses.replace(
            record, headers=(*record.headers, ("saga-type", saga_type.encode()))
        )
    return decode(record, REG, 1 << 20)


def _row(saga_type: str) -> SagaRow:
    return SagaRow(saga_type, "o1", {"captures": 0}, ACTIVE, 1)


def test_a_reply_goes_only_to_the_saga_type_it_names() -> None:
    planner = Planner(
        bind_all([BillingSaga, RefundSaga], registry=REG), registry=REG, dead_letter_topic="dl"
    )
    log = Log()
    items, _ = planner.route([_reply(log, MINE), _reply(log, None)])  # type: ignore[list-item]
    routed = [i.bound.saga_type for i in items if isinstance(i, Item)]
    # Named: its own saga only. Unnamed (an upstream event): every saga handling the type.
    assert routed == [MINE, MINE, OTHER]
    ws = planner.plan(items, _loaded(_row(MINE), _row(OTHER)), _loaded().now)
    outcomes = Counter(h.outcome for h in ws.history)
    assert outcomes == {Outcome.APPLIED: 3}


def test_a_reply_to_a_saga_type_run_elsewhere_is_counted_not_recorded() -> None:
    planner = Planner(bind_all([BillingSaga], registry=REG), registry=REG, dead_letter_topic="dl")
    log = Log()
    decoded = [_reply(log, OTHER), _reply(log, OTHER), _reply(log, MINE)]
    prepared = planner.prepare(decoded)  # type: ignore[arg-type]
    batch = Batch.of(prepared, {("in", 0): Owned(1, 1)})
    assert batch.foreign == {("in", OTHER): 2}
    ws = planner.apply(prepared, _loaded(_row(MINE)))
    # No `no-saga` rows for the other deployment's replies; the offsets still move past them.
    assert [h.outcome for h in ws.history] == [Outcome.APPLIED]
    assert [o.next_offset for o in batch.offsets] == [4]
