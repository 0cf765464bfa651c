"""Deadline API forms the property test does not reach: instants, payloads, conditional end."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from pydantic import BaseModel

from processor import (
    Message,
    MessageMetadata,
    SagaCommands,
    SagaDeadlines,
    SagaDefinitionError,
    SagaLifecycle,
    SagaState,
    message_type,
    saga,
    saga_deadline_handler,
    saga_event_handler,
)
from processor.testing import DEFAULT_START_TIME, SagaFixture

T0 = DEFAULT_START_TIME


class Nudge(BaseModel):
    attempt: int
    since: datetime


@message_type("test.deadline-extra.Opened")
class Opened(Message):
    case_id: str
    at: datetime


@message_type("test.deadline-extra.Nudged", topic="test.deadline-extra.commands")
class Nudged(Message):
    case_id: str
    attempt: int
    since: datetime


@saga(type="deadline-extra")
class Case(SagaState):
    case_id: str = ""

    @saga_event_handler(Opened, association_property="case_id", start=True)
    def opened(self, event: Opened, deadlines: SagaDeadlines) -> None:
        self.case_id = event.case_id
        deadlines.schedule("nudge", at=event.at, payload=Nudge(attempt=1, since=event.at))
        deadlines.schedule("close", timedelta(days=30))

    @saga_deadline_handler("nudge")
    def on_nudge(
        self,
        commands: SagaCommands,
        nudge: Nudge,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
    ) -> None:
        commands.send(Nudged(case_id=self.case_id, attempt=nudge.attempt, since=nudge.since))
        if nudge.attempt < 3:
            later = Nudge(attempt=nudge.attempt + 1, since=nudge.since)
            deadlines.schedule("nudge", timedelta(hours=1), later)
        else:
            lifecycle.end()

    @saga_deadline_handler("close", end=True)
    def on_close(self) -> None:
        """Never reached in these tests: the third nudge ends the saga first."""


def test_absolute_instant_and_typed_payload_reach_the_handler() -> None:
    fixture = SagaFixture(Case)
    at = T0 + timedelta(minutes=10)
    fixture.when(Opened(case_id="c", at=at)).expect_deadline_scheduled("nudge", at=at)
    fixture.when_time_elapses(timedelta(minutes=9)).expect_no_commands()
    result = fixture.when_time_elapses(timedelta(minutes=1))
    assert result.fired == ["nudge"]
    result.expect_commands(Nudged(case_id="c", attempt=1, since=at))


def test_an_instant_already_past_fires_on_the_next_clock_step() -> None:
    fixture = SagaFixture(Case)
    past = T0 - timedelta(days=1)
    fixture.when(Opened(case_id="c", at=past))
    result = fixture.when_time_elapses(timedelta(0))
    assert result.fired == ["nudge"]
    result.expect_commands(Nudged(case_id="c", attempt=1, since=past))


def test_conditional_end_in_a_deadline_handler_cancels_every_other_deadline() -> None:
    fixture = SagaFixture(Case)
    fixture.when(Opened(case_id="c", at=T0 + timedelta(minutes=1)))
    result = fixture.when_time_elapses(timedelta(hours=3))
    assert result.fired == ["nudge", "nudge", "nudge"]
    result.expect_ended().expect_no_deadlines()
    assert [c.message.attempt for c in result.command_intents] == [1, 2, 3]  # type: ignore[attr-defined]


def test_deadline_handlers_cannot_ask_for_message_metadata() -> None:
    with pytest.raises(SagaDefinitionError, match="meta"):

        @saga(type="deadline-extra-bad")
        class Bad(SagaState):
            @saga_event_handler(Opened, association_property="case_id", start=True)
            def opened(self, event: Opened) -> None: ...

            @saga_deadline_handler("t")
            def on_t(self, meta: MessageMetadata) -> None: ...
