"""A plain saga hands itself to a person with lifecycle.escalate, and a decision resumes it."""

from __future__ import annotations

from typing import Any

import pytest

from processor import (
    DecisionRequest,
    SagaCommands,
    SagaLifecycle,
    SagaOutcome,
    SagaState,
    saga,
    saga_decision_handler,
    saga_event_handler,
)
from processor.testing import SagaFixture
from schemas.orders import (
    EscalateToPerson,
    OrderShipped,
    ShipmentFailed,
    ShipOrder,
)

OID = "o-1"
FACTS: dict[str, Any] = {
    "order_id": OID,
    "customer_id": "c-1",
    "sku": "mug",
    "quantity": 1,
    "amount": 5,
}


class _Parcel(SagaState):
    order_id: str = ""
    failures: int = 0

    @saga_event_handler(ShipOrder, association_property="order_id", start=True)
    def on_ship(self, event: ShipOrder, commands: SagaCommands) -> None:
        self.order_id = event.order_id
        commands.send(ShipOrder(**FACTS))

    @saga_event_handler(ShipmentFailed, association_property="order_id")
    def on_failed(
        self, event: ShipmentFailed, commands: SagaCommands, lifecycle: SagaLifecycle
    ) -> None:
        self.failures += 1
        if self.failures < 2:
            commands.send(ShipOrder(**FACTS))
            return
        # Twice is a pattern, not bad luck: a person looks before anything is refunded.
        commands.send(
            EscalateToPerson(
                order_id=self.order_id,
                reason="retries-exhausted",
                step="ship",
                machine_state="WAITING",
                detail="the carrier failed twice",
            )
        )
        lifecycle.escalate("the carrier failed twice")

    @saga_event_handler(OrderShipped, association_property="order_id", end=True)
    def on_shipped(self, event: OrderShipped) -> None:
        """Shipped after all: done."""


@saga(type="parcel-saga")
class ParcelSaga(_Parcel):
    @saga_decision_handler()
    def on_decision(
        self, request: DecisionRequest, commands: SagaCommands, lifecycle: SagaLifecycle
    ) -> None:
        if request.decision == "retry":
            self.failures = 0
            commands.send(ShipOrder(**FACTS))
        else:
            lifecycle.end(SagaOutcome.FAILED)


@saga(type="parcel-without-decisions")
class Undecidable(_Parcel):
    pass


def _escalated(cls: type[SagaState] = ParcelSaga) -> SagaFixture:
    f = SagaFixture(cls)
    f.when(ShipOrder(**FACTS))
    f.when(ShipmentFailed(order_id=OID, reason="no carrier")).expect_commands(ShipOrder(**FACTS))
    r = f.when(ShipmentFailed(order_id=OID, reason="no carrier"))
    assert [type(c) for c in r.commands] == [EscalateToPerson]
    assert r.waiting == "the carrier failed twice"
    r.expect_active()
    return f


def test_an_event_resumes_a_saga_waiting_on_a_person() -> None:
    f = _escalated()
    r = f.when(OrderShipped(order_id=OID)).expect_ended("COMPLETED")
    assert r.waiting is None


def test_an_operators_decision_runs_the_decision_handler() -> None:
    f = _escalated()
    r = f.when_resolved("retry", "carrier is back").expect_commands(ShipOrder(**FACTS))
    assert r.waiting is None
    r.expect_state(failures=0)
    f.when_resolved("give-up", "customer refunded by hand").expect_ended("FAILED")


def test_a_saga_without_a_decision_handler_refuses_a_decision() -> None:
    f = _escalated(Undecidable)
    with pytest.raises(AssertionError, match="no steps that wait on a person's decision"):
        f.when_resolved("retry")


def test_escalate_needs_a_reason() -> None:
    with pytest.raises(ValueError, match="say why"):
        SagaLifecycle().escalate("  ")
