"""An orchestrated saga's reply handlers are checked against its steps when the class is made."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

import pytest

from processor import SagaCommands, SagaDeadlines, SagaLifecycle, saga, saga_event_handler
from processor._authoring.messages import Message
from processor._authoring.orchestration import (
    Escalation,
    OrchestratedSaga,
    Orchestration,
    ReplyHandler,
    Step,
    lint,
    on_reply,
)
from processor._errors import SagaDefinitionError
from schemas.orders import (
    EscalateToPerson,
    OrderPlaced,
    ReleaseStock,
    ReserveStock,
    StockReleased,
    StockReserved,
)


def _escalate(order: Any, escalation: Escalation) -> Message:
    return EscalateToPerson(order_id=order.order_id, **escalation.model_dump())


def _reserve(order: Any) -> Message:
    return ReserveStock(order_id=order.order_id, customer_id="c", sku="s", quantity=1, amount=1)


ONE_STEP = Orchestration(
    steps=(Step("reserve", action=_reserve, timeout=timedelta(seconds=5)),),
    escalation=_escalate,
)


class _Base(OrchestratedSaga):
    orchestration = ONE_STEP
    order_id: str = ""

    @saga_event_handler(OrderPlaced, association_property="order_id", start=True)
    def on_placed(
        self,
        event: OrderPlaced,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
    ) -> None:
        self.order_id = event.order_id
        self.begin(event.order_id, commands, deadlines, lifecycle)


def test_a_reply_handler_naming_a_missing_step_fails_at_import_and_names_it() -> None:
    with pytest.raises(SagaDefinitionError) as info:

        @saga(type="typo-saga")
        class Typo(_Base):
            on_reserved: ClassVar[ReplyHandler] = on_reply(
                StockReserved, step="reserv", association_property="order_id"
            )

    text = str(info.value)
    assert "reply handler on_reserved names step 'reserv'" in text
    assert "did you mean 'reserve'?" in text


def test_every_wiring_problem_is_reported_at_once() -> None:
    with pytest.raises(SagaDefinitionError) as info:

        @saga(type="two-problems")
        class Two(_Base):
            on_reserved: ClassVar[ReplyHandler] = on_reply(
                StockReserved, step="ship", association_property="order_id"
            )
            # The step has no compensation, so nothing can be undone.
            on_released: ClassVar[ReplyHandler] = on_reply(
                StockReleased, step="reserve", kind="undone", association_property="order_id"
            )

    text = str(info.value)
    assert "names step 'ship'" in text
    assert "reports the undo (undone) of step 'reserve', which declares no compensation" in text


def test_an_orchestrated_saga_without_an_orchestration_fails_at_import() -> None:
    with pytest.raises(SagaDefinitionError, match="set orchestration = Orchestration"):

        @saga(type="no-steps")
        class NoSteps(OrchestratedSaga):
            order_id: str = ""

            @saga_event_handler(OrderPlaced, association_property="order_id", start=True)
            def on_placed(self, event: OrderPlaced) -> None:
                self.order_id = event.order_id


def test_lint_warns_of_steps_no_reply_moves_on() -> None:
    @saga(type="silent-saga")
    class Silent(_Base):
        orchestration = Orchestration(
            steps=(
                Step(
                    "reserve",
                    action=_reserve,
                    compensation=lambda o: ReleaseStock(
                        order_id=o.order_id, customer_id="c", sku="s", quantity=1, amount=1
                    ),
                ),
            ),
            escalation=_escalate,
        )

    problems = lint(Silent.machine_spec())
    assert any("step 'reserve' has no on_reply(..., kind='succeeded')" in p for p in problems)
    assert any("no on_reply(..., kind='undone')" in p for p in problems)

    @saga(type="wired-saga")
    class Wired(_Base):
        on_reserved: ClassVar[ReplyHandler] = on_reply(
            StockReserved, step="reserve", association_property="order_id"
        )

    assert lint(Wired.machine_spec()) == []
