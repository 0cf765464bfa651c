"""Replies declared beside their steps, the association property said once, the start generated.

``Step(..., replies=Replies(...))`` and ``Orchestration(start=...)`` make the handlers that
``on_reply`` and a hand-written start handler would; ``@saga(association_property=...)`` keys
them all. A reply declared twice, or an event without the saga's association field, fails at
import naming the fix; the older spellings keep working beside the new ones.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Annotated, Any, ClassVar

import pytest

from processor import SagaState, Setting, saga, saga_event_handler
from processor._authoring.definition import definition_of
from processor._authoring.messages import Message, message_type
from processor._authoring.orchestration import (
    SAGA_DEADLINE,
    STEP_TIMER,
    Escalation,
    HandlerIo,
    MachineState,
    OrchestratedSaga,
    Orchestration,
    Replies,
    ReplyHandler,
    RetryPolicy,
    SettingKeys,
    Step,
    lint,
    on_reply,
)
from processor._authoring.orchestration.replies import reply_handlers
from processor._errors import SagaDefinitionError
from processor.testing import SagaFixture
from schemas.orders import (
    CapturePayment,
    EscalateToPerson,
    OrderPlaced,
    OrderShipped,
    PaymentCaptured,
    PaymentDeclined,
    PaymentRefunded,
    RefundFailed,
    RefundPayment,
    ReleaseStock,
    ReserveStock,
    ShipmentFailed,
    ShipOrder,
    StockReleased,
    StockReservationFailed,
    StockReserved,
    StockUnavailable,
)

OID = "o-1"
FACTS: dict[str, Any] = {
    "order_id": OID,
    "customer_id": "c-1",
    "sku": "s-1",
    "quantity": 2,
    "amount": Decimal("5.00"),
}
PLACED = OrderPlaced(**FACTS)
S = MachineState


@message_type("tests.declared.StockBusy", topic="tests.declared-events")
class StockBusy(Message):
    """The stock service's breaker is open: it did not run the command."""

    order_id: str


def _cmd(cls: type[Message]) -> Message:
    return cls(**FACTS)


def _reserve(o: Any) -> Message:
    return ReserveStock(**FACTS)


def _facts(o: Shop) -> dict[str, Any]:
    assert o.order is not None
    return o.order.model_dump()


def _escalate(o: Shop, e: Escalation) -> Message:
    return EscalateToPerson(order_id=o.order_id, **e.model_dump())


SHOP = Orchestration["Shop"](
    start=OrderPlaced,
    steps=(
        Step(
            "reserve",
            action=lambda o: ReserveStock(**_facts(o)),
            compensation=lambda o: ReleaseStock(**_facts(o)),
            idempotent=True,
            retry=RetryPolicy(max_attempts=2, base_delay=timedelta(seconds=1), jitter=0),
            replies=Replies(
                succeeded=StockReserved,
                rejected=StockUnavailable,
                failed=StockReservationFailed,
                unavailable=StockBusy,
                undone=StockReleased,
            ),
        ),
        Step(
            "pay",
            action=lambda o: CapturePayment(**_facts(o)),
            compensation=lambda o: RefundPayment(**_facts(o)),
            undo_retry=RetryPolicy(max_attempts=2, base_delay=timedelta(seconds=1), jitter=0),
            replies=Replies(
                succeeded=PaymentCaptured,
                rejected=PaymentDeclined,
                undone=PaymentRefunded,
                undo_failed=RefundFailed,
            ),
        ),
        Step(
            "ship",
            action=lambda o: ShipOrder(**_facts(o)),
            replies=Replies(succeeded=OrderShipped, rejected=ShipmentFailed),
        ),
    ),
    escalation=_escalate,
    sla=timedelta(hours=1),
    settings=SettingKeys(sla="shop.sla", timeouts={"pay": "shop.pay-timeout"}),
)


@saga(type="declared-shop", association_property="order_id")
class Shop(OrchestratedSaga):
    """Every reply declared beside its step; the start handler generated."""

    orchestration = SHOP
    # The start event whole (a field typed with its class), and one of its fields by name.
    order: OrderPlaced | None = None
    order_id: str = ""


def test_the_generated_handlers_are_those_on_reply_makes_keyed_by_the_saga_property() -> None:
    assert sorted(reply_handlers(Shop)) == sorted(
        [
            ("on_StockReserved", "reserve", "succeeded"),
            ("on_StockUnavailable", "reserve", "rejected"),
            ("on_StockReservationFailed", "reserve", "failed"),
            ("on_StockBusy", "reserve", "unavailable"),
            ("on_StockReleased", "reserve", "undone"),
            ("on_PaymentCaptured", "pay", "succeeded"),
            ("on_PaymentDeclined", "pay", "rejected"),
            ("on_PaymentRefunded", "pay", "undone"),
            ("on_RefundFailed", "pay", "undo-failed"),
            ("on_OrderShipped", "ship", "succeeded"),
            ("on_ShipmentFailed", "ship", "rejected"),
        ]
    )
    handlers = definition_of(Shop).event_handlers
    assert {h.association_property for h in handlers.values()} == {"order_id"}
    assert [h.name for h in handlers.values() if h.start] == ["on_OrderPlaced"]
    # lint-saga sees them: every step has a success reply, every undo its confirmation.
    assert lint(Shop.machine_spec()) == []


def test_the_start_handler_keeps_the_event_and_begins_with_the_settings_declared() -> None:
    f = SagaFixture(Shop, settings={"shop.pay-timeout": "PT5M"})
    f.when(PLACED).expect_commands(_cmd(ReserveStock)).expect_deadline_scheduled(
        SAGA_DEADLINE, after=timedelta(hours=1)
    )
    state = f.state
    assert isinstance(state, Shop)
    assert (state.order, state.order_id) == (PLACED, OID)
    assert state.progress.key == OID
    assert state.progress.timeouts == {"pay": timedelta(minutes=5)}
    f = SagaFixture(Shop, settings={"shop.sla": "PT10M"})
    f.when(PLACED).expect_deadline_scheduled(SAGA_DEADLINE, after=timedelta(minutes=10))


def test_each_declared_reply_kind_moves_its_step_its_way() -> None:
    f = SagaFixture(Shop)
    f.when(PLACED)
    # unavailable: the same attempt again after the breaker wait (30 s by default).
    f.when(StockBusy(order_id=OID)).expect_no_commands()
    f.when_time_elapses(timedelta(seconds=30)).expect_commands(_cmd(ReserveStock))
    # failed: retried after the backoff.
    f.when(StockReservationFailed(order_id=OID, reason="busy")).expect_no_commands()
    f.when_time_elapses(timedelta(seconds=1)).expect_commands(_cmd(ReserveStock))
    # succeeded: the next step.
    f.when(StockReserved(order_id=OID)).expect_commands(_cmd(CapturePayment))
    f.when(PaymentCaptured(order_id=OID)).expect_commands(_cmd(ShipOrder))
    # rejected: never retried; compensation, last step first.
    f.when(ShipmentFailed(order_id=OID, reason="no carrier")).expect_commands(_cmd(RefundPayment))
    # undo-failed: the undo retried; undone: the next undo.
    f.when(RefundFailed(order_id=OID, reason="provider down")).expect_no_commands()
    f.when_time_elapses(timedelta(seconds=1)).expect_commands(_cmd(RefundPayment))
    f.when(PaymentRefunded(order_id=OID)).expect_commands(_cmd(ReleaseStock))
    f.when(StockReleased(order_id=OID)).expect_no_commands().expect_ended()
    state = f.state
    assert isinstance(state, Shop)
    assert state.progress.undone == ["pay", "reserve"]
    assert state.progress.breaker_waits == 1


def test_a_rejected_first_step_ends_with_nothing_to_undo() -> None:
    f = SagaFixture(Shop)
    f.when(PLACED)
    f.when(StockUnavailable(order_id=OID, reason="none left")).expect_no_commands().expect_ended()
    assert isinstance(f.state, Shop)
    assert f.state.machine_state == S.FAILED


def test_the_association_property_said_once_keys_on_reply_and_hand_written_handlers() -> None:
    @saga(type="declared-mixed", association_property="order_id")
    class Mixed(OrchestratedSaga):
        orchestration = Orchestration(
            steps=(Step("reserve", action=lambda o: ReserveStock(**FACTS)),),
            escalation=_escalate,
        )
        order_id: str = ""

        @saga_event_handler(start=True)
        def on_placed(self, event: OrderPlaced, io: HandlerIo) -> None:
            self.begin(event, io)

        on_reserved: ClassVar[ReplyHandler] = on_reply(StockReserved, step="reserve")

    handlers = definition_of(Mixed).event_handlers
    assert handlers[OrderPlaced].association_property == "order_id"
    assert handlers[StockReserved].association_property == "order_id"
    f = SagaFixture(Mixed)
    f.when(PLACED).expect_commands(_cmd(ReserveStock))
    f.when(StockReserved(order_id=OID)).expect_ended("COMPLETED")

    # Plain sagas too.
    @saga(type="declared-plain", association_property="order_id")
    class Plain(SagaState):
        seen: int = 0

        @saga_event_handler(start=True)
        def on_placed(self, event: OrderPlaced) -> None:
            self.seen += 1

    assert definition_of(Plain).event_handlers[OrderPlaced].association_property == "order_id"


def test_the_older_spellings_still_work_beside_the_new() -> None:
    """``on_reply`` with its own association property, and ``begin(id, commands, ...)``."""

    @saga(type="declared-old-and-new", association_property="order_id")
    class Both(OrchestratedSaga):
        orchestration = Orchestration(
            steps=(
                Step(
                    "reserve",
                    action=lambda o: ReserveStock(**FACTS),
                    replies=Replies(succeeded=StockReserved),
                ),
                Step("pay", action=lambda o: CapturePayment(**FACTS)),
            ),
            escalation=_escalate,
        )
        order_id: str = ""

        @saga_event_handler(OrderPlaced, association_property="order_id", start=True)
        def on_placed(self, event: OrderPlaced, io: HandlerIo) -> None:
            self.order_id = event.order_id
            self.begin(event.order_id, io.commands, io.deadlines, io.lifecycle)

        on_captured: ClassVar[ReplyHandler] = on_reply(
            PaymentCaptured, step="pay", association_property="order_id"
        )

    f = SagaFixture(Both)
    f.when(PLACED).expect_commands(_cmd(ReserveStock))
    f.when(StockReserved(order_id=OID)).expect_commands(_cmd(CapturePayment))
    f.when(PaymentCaptured(order_id=OID)).expect_ended("COMPLETED")


def test_a_hand_written_start_handler_begins_with_its_event_io_and_settings() -> None:
    @saga(type="declared-hand-start", association_property="order_id")
    class Hand(OrchestratedSaga):
        orchestration = Orchestration(
            steps=(
                Step(
                    "reserve",
                    action=lambda o: ReserveStock(**FACTS),
                    idempotent=True,
                    replies=Replies(succeeded=StockReserved),
                ),
            ),
            escalation=_escalate,
        )
        order_id: str = ""
        sku: str = ""

        @saga_event_handler(start=True)
        def on_placed(
            self,
            event: OrderPlaced,
            io: HandlerIo,
            retry: Annotated[RetryPolicy, Setting("hand.retry", default=RetryPolicy())],
        ) -> None:
            self.begin(event, io, retries={"reserve": retry})

    f = SagaFixture(Hand, settings={"hand.retry": {"max_attempts": 3}})
    f.when(PLACED).expect_commands(_cmd(ReserveStock)).expect_deadline_scheduled(STEP_TIMER)
    state = f.state
    assert isinstance(state, Hand)
    assert (state.order_id, state.sku) == (OID, "s-1")
    assert state.progress.retries["reserve"].max_attempts == 3


# -- mistakes, each failing at import with the fix named -------------------------------------


def test_a_reply_declared_beside_its_step_and_by_on_reply_fails_naming_both() -> None:
    with pytest.raises(SagaDefinitionError) as info:

        @saga(type="declared-twice", association_property="order_id")
        class Twice(OrchestratedSaga):
            orchestration = SHOP
            order: OrderPlaced | None = None
            order_id: str = ""
            on_reserved: ClassVar[ReplyHandler] = on_reply(StockReserved, step="reserve")

    assert (
        "StockReserved is declared twice, by Step('reserve', replies=Replies(succeeded=...)) "
        "and by on_reserved = on_reply(...); keep one"
    ) in str(info.value)


def test_a_start_event_also_handled_by_hand_fails_naming_both() -> None:
    with pytest.raises(SagaDefinitionError) as info:

        @saga(type="declared-two-starts", association_property="order_id")
        class TwoStarts(OrchestratedSaga):
            orchestration = SHOP
            order: OrderPlaced | None = None
            order_id: str = ""

            @saga_event_handler(start=True)
            def on_placed(self, event: OrderPlaced, io: HandlerIo) -> None:
                self.begin(event, io)

    assert (
        "OrderPlaced is declared twice, by Orchestration(start=...) and by on_placed = "
        "@saga_event_handler"
    ) in str(info.value)


def test_a_reply_declared_for_two_steps_fails_where_the_orchestration_is_written() -> None:
    with pytest.raises(SagaDefinitionError) as info:
        Orchestration(
            steps=(
                Step("reserve", action=_reserve, replies=Replies(succeeded=StockReserved)),
                Step("pay", action=_reserve, replies=Replies(failed=StockReserved)),
            ),
            escalation=_escalate,
        )
    assert (
        "StockReserved is declared twice, by Step('reserve', replies=Replies(succeeded=...)) "
        "and by Step('pay', replies=Replies(failed=...))"
    ) in str(info.value)
    with pytest.raises(SagaDefinitionError, match="StockReserved is given twice"):
        Replies(succeeded=StockReserved, failed=(StockUnavailable, StockReserved))
    with pytest.raises(SagaDefinitionError, match="is not a Message subclass"):
        Replies(succeeded="StockReserved")  # type: ignore[arg-type]


def test_an_event_without_the_saga_association_field_fails_naming_class_and_field() -> None:
    with pytest.raises(SagaDefinitionError) as info:

        @saga(type="declared-wrong-field", association_property="reason")
        class WrongField(OrchestratedSaga):
            orchestration = Orchestration(
                start=OrderPlaced,
                steps=(
                    Step(
                        "reserve",
                        action=_reserve,
                        replies=Replies(succeeded=StockReserved, rejected=StockUnavailable),
                    ),
                ),
                escalation=_escalate,
            )

    text = str(info.value)
    # StockUnavailable has a reason; the start event and the success reply have none.
    assert "association_property 'reason' (the saga's, from @saga(association_property=...))" in (
        text
    )
    assert "is not a field of OrderPlaced" in text
    assert "is not a field of StockReserved" in text
    assert "StockUnavailable" not in text


def test_generated_handlers_without_any_association_property_name_where_to_say_it() -> None:
    with pytest.raises(SagaDefinitionError) as info:

        @saga(type="declared-no-field")
        class NoField(OrchestratedSaga):
            orchestration = Orchestration(
                start=OrderPlaced,
                steps=(Step("r", action=_reserve, replies=Replies(succeeded=StockReserved)),),
                escalation=_escalate,
            )

    assert "or once for the saga: @saga(type=..., association_property='...')" in str(info.value)


def test_declaration_mistakes_fail_where_they_are_written() -> None:
    with pytest.raises(SagaDefinitionError, match="reports an undo, but the step declares no"):
        Step("reserve", action=_reserve, replies=Replies(undone=StockReleased))
    with pytest.raises(SagaDefinitionError) as info:
        Orchestration(
            steps=(Step("reserve", action=_reserve),),
            escalation=_escalate,
            settings=SettingKeys(timeouts={"reserv": "shop.timeout"}, retries={"reserve": "x"}),
        )
    text = str(info.value)
    assert "timeouts for step 'reserv', which the orchestration does not declare" in text
    assert "did you mean 'reserve'?" in text
    assert "retries for step 'reserve', which is not idempotent" in text
    assert "settings= are read by the generated start handler: declare start=EventClass" in text
    with pytest.raises(SagaDefinitionError, match="non-empty settings key"):
        SettingKeys(sla="")


# -- typed builders ---------------------------------------------------------------------------


def test_a_builder_reading_a_missing_attribute_is_a_mypy_error() -> None:
    """mypy types ``o`` as Shop here: the ignore below is needed, and an unneeded one fails
    mypy (``warn_unused_ignores``), so this file type-checks only while the typo is caught."""
    typo = Orchestration["Shop"](
        steps=(
            Step(
                "reserve",
                action=lambda o: ReserveStock(order_id=o.order_idd, **FACTS),  # type: ignore[attr-defined]
            ),
        ),
        escalation=lambda o, e: EscalateToPerson(order_id=o.order_id, **e.model_dump()),
    )
    with pytest.raises(AttributeError, match="order_idd"):
        typo.steps[0].action(Shop())  # type: ignore[call-arg]
