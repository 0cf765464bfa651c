"""Mistakes in a saga's or participant's declaration fail where they are written, naming the fix.

Each of these once passed import, ``lint-saga`` and the runtime without a word: a misspelt reply
kind or policy, a decorator written without its parentheses, a handler of the wrong kind for its
class decorator.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest

from processor import (
    SagaCommands,
    SagaDeadlines,
    SagaLifecycle,
    SagaState,
    saga,
    saga_cancel_handler,
    saga_deadline_handler,
    saga_decision_handler,
    saga_event_handler,
)
from processor._authoring.choices import choice_problem
from processor._authoring.definition import (
    CANCEL_HANDLER,
    DECISION_HANDLER,
    CancelRequest,
    DecisionRequest,
    definition_of,
)
from processor._authoring.messages import Message, MessageRegistry, message_type
from processor._authoring.orchestration import (
    Escalation,
    OrchestratedSaga,
    Orchestration,
    ReplyHandler,
    Step,
    on_decision,
    on_reply,
)
from processor._cli import main
from processor._errors import SagaDefinitionError
from processor.participant import DROP, command_handler, participant, participant_of

REG = MessageRegistry()


@message_type("trip.TripRequested", topic="trips", registry=REG)
class TripRequested(Message):
    trip_id: str


@message_type("trip.BookHotel", topic="hotel-commands", registry=REG)
class BookHotel(Message):
    trip_id: str


@message_type("trip.CancelHotel", topic="hotel-commands", registry=REG)
class CancelHotel(Message):
    trip_id: str


@message_type("trip.HotelBooked", topic="trip-replies", registry=REG)
class HotelBooked(Message):
    trip_id: str


@message_type("trip.HotelRejected", topic="trip-replies", registry=REG)
class HotelRejected(Message):
    trip_id: str
    reason: str


@message_type("trip.TripDecision", topic="trip-replies", registry=REG)
class TripDecision(Message):
    trip_id: str
    decision: str


def _book(trip: Any) -> Message:
    return BookHotel(trip_id=trip.trip_id)


def _escalate(trip: Any, escalation: Escalation) -> Message:
    return CancelHotel(trip_id=trip.trip_id)


class _Trip(OrchestratedSaga):
    orchestration = Orchestration(steps=(Step("hotel", action=_book),), escalation=_escalate)
    trip_id: str = ""

    @saga_event_handler(TripRequested, association_property="trip_id", start=True)
    def on_requested(
        self,
        event: TripRequested,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
    ) -> None:
        self.trip_id = event.trip_id
        self.begin(event.trip_id, commands, deadlines, lifecycle)


def _problems(info: pytest.ExceptionInfo[SagaDefinitionError]) -> str:
    return "\n".join(info.value.problems)


# -- string choices -----------------------------------------------------------------------------


def test_the_choice_message_names_parameter_value_choices_and_the_closest() -> None:
    assert choice_problem("on_exhausted", "compensate", ("compensate", "fail")) is None
    assert choice_problem("on_exhausted", "escalte", ("compensate", "escalate")) == (
        "on_exhausted='escalte' is not one of 'compensate', 'escalate'; did you mean 'escalate'?"
    )
    assert choice_problem("kind", 3, ("succeeded",)) == "kind=3 is not one of 'succeeded'"


def test_a_misspelt_reply_kind_fails_at_the_on_reply_line() -> None:
    with pytest.raises(SagaDefinitionError) as info:

        class Trip(_Trip):
            on_rejected: ClassVar[ReplyHandler] = on_reply(
                HotelRejected,
                step="hotel",
                kind="reject",  # type: ignore[arg-type]
                association_property="trip_id",
            )

    assert info.value.subject == "on_reply(HotelRejected, step='hotel')"
    assert _problems(info) == (
        "kind='reject' is not one of 'succeeded', 'failed', 'rejected', 'unavailable', "
        "'undone', 'undo-failed'; did you mean 'rejected'?"
    )


def test_reply_and_decision_fields_must_be_fields_of_the_event() -> None:
    with pytest.raises(SagaDefinitionError) as info:
        on_reply(HotelRejected, step="hotel", association_property="trip_id", reason_field="why")
    assert "reason_field='why' is not one of 'trip_id', 'reason'" in _problems(info)
    with pytest.raises(SagaDefinitionError) as info:
        on_decision(TripDecision, association_property="trip_id", decision_field="decison")
    assert "decision_field='decison' is not one of 'trip_id', 'decision'; did you mean " in str(
        info.value
    )
    # The default reason field is read only when the event has one.
    on_reply(HotelBooked, step="hotel", association_property="trip_id")


def test_a_hand_written_reply_of_an_unknown_kind_parks_rather_than_guesses() -> None:
    trip = _Trip()
    handle: Any = None
    with pytest.raises(ValueError, match=r"kind='undo_failed' .* did you mean 'undo-failed'\?"):
        trip.reply("hotel", cast(Any, "undo_failed"), handle, handle, handle)
    assert trip.resolution_refusal("retyr") == (
        "decision='retyr' is not one of 'retry', 'skip', 'compensate'; did you mean 'retry'?"
    )


@pytest.mark.parametrize(
    ("field", "value", "closest"),
    [
        ("on_exhausted", "escalte", "escalate"),
        ("late_success", "undo ", "undo"),
        ("on_timeout", "Compensate", "compensate"),
    ],
)
def test_a_misspelt_step_policy_fails_at_the_step_line(
    field: str, value: str, closest: str
) -> None:
    policy: dict[str, Any] = {field: value}
    with pytest.raises(SagaDefinitionError) as info:
        Step("hotel", action=_book, **policy)
    assert info.value.subject == "step 'hotel'"
    assert f"{field}={value!r} is not one of " in _problems(info)
    assert _problems(info).endswith(f"did you mean {closest!r}?")


def test_a_step_lists_every_problem_of_its_own_at_once() -> None:
    with pytest.raises(SagaDefinitionError) as info:
        Step("hotel", action=_book, timeout=30, on_exhausted="fial", late_success="never")  # type: ignore[arg-type]
    problems = info.value.problems
    assert len(problems) == 3
    assert "timeout must be a timedelta, not 30" in problems


def test_a_misspelt_saga_timeout_policy_fails_at_the_orchestration() -> None:
    with pytest.raises(SagaDefinitionError) as info:
        Orchestration(
            steps=(Step("hotel", action=_book),),
            escalation=_escalate,
            on_saga_timeout="fial",  # type: ignore[arg-type]
        )
    assert "on_saga_timeout='fial' is not one of 'compensate', 'escalate', 'fail'; did you " in (
        _problems(info)
    )


def test_a_misspelt_expiry_is_reported_by_the_participant() -> None:
    with pytest.raises(SagaDefinitionError) as info:

        @participant(name="hotel")
        class Hotel:
            @command_handler(expired="dorp")  # type: ignore[call-overload, untyped-decorator]
            def book(self, command: BookHotel) -> None: ...

    assert "handler " in _problems(info)
    assert "expired='dorp' is not one of 'drop'; did you mean 'drop'? (or pass a function" in (
        _problems(info)
    )


# -- decorators written bare --------------------------------------------------------------------


def test_a_bare_command_handler_reads_the_command_type_from_its_parameter() -> None:
    @participant(name="hotel")
    class Hotel:
        @command_handler
        def cancel(self, command: CancelHotel) -> None: ...

    handler = participant_of(Hotel).handlers[CancelHotel]
    assert (handler.name, handler.expired) == ("cancel", DROP)


def test_bare_cancel_and_decision_handlers_take_their_defaults() -> None:
    @saga(type="bare-trip")
    class Trip(SagaState):
        trip_id: str = ""

        @saga_event_handler(association_property="trip_id", start=True)
        def on_requested(self, event: TripRequested) -> None: ...

        @saga_cancel_handler
        def on_cancel(self, request: CancelRequest) -> None: ...

        @saga_decision_handler
        def on_decision(self, request: DecisionRequest) -> None: ...

    handlers = definition_of(Trip).deadline_handlers
    assert handlers[CANCEL_HANDLER].name == "on_cancel"
    assert handlers[DECISION_HANDLER].name == "on_decision"
    assert not handlers[CANCEL_HANDLER].end


def test_decorators_that_need_arguments_fail_bare_showing_the_spelling() -> None:
    with pytest.raises(SagaDefinitionError) as info:

        class Trip(SagaState):
            @saga_event_handler
            def on_requested(self, event: TripRequested) -> None: ...

    assert "@saga_event_handler on " in str(info.value)
    assert "Trip.on_requested needs arguments; write " in str(info.value)
    assert "@saga_event_handler(association_property='...'); the event type is read " in (
        str(info.value)
    )
    with pytest.raises(SagaDefinitionError, match=r"write @saga_deadline_handler\('payment-"):

        class Timer(SagaState):
            @saga_deadline_handler  # type: ignore[arg-type]
            def on_timeout(self) -> None: ...  # type: ignore[misc]

    with pytest.raises(SagaDefinitionError, match=r"@saga on .*Bare needs arguments; write "):

        @saga
        class Bare(SagaState):
            trip_id: str = ""

    with pytest.raises(SagaDefinitionError, match=r"write @participant\(name='inventory'\)"):

        @participant
        class Hotel:
            @command_handler
            def cancel(self, command: CancelHotel) -> None: ...


def test_two_command_handlers_on_one_method_are_reported() -> None:
    with pytest.raises(SagaDefinitionError, match="carries 2 @command_handler decorators"):

        @participant(name="hotel")
        class Hotel:
            @command_handler(BookHotel)
            @command_handler(CancelHotel)
            def both(self, command: Message) -> None: ...


# -- handlers of the other kind -----------------------------------------------------------------


def test_command_handlers_in_a_saga_name_the_participant_decorator() -> None:
    with pytest.raises(SagaDefinitionError) as info:

        @saga(type="hotel")
        class Hotel:  # type: ignore[type-var]
            @command_handler
            def cancel(self, command: CancelHotel) -> None: ...

    text = _problems(info)
    assert "Hotel.cancel is a command handler (@command_handler), and command handlers run " in text
    assert "only in a participant: decorate the class with @participant(name='...'), not @saga" in (
        text
    )


def test_saga_handlers_in_a_participant_name_the_saga_decorator() -> None:
    with pytest.raises(SagaDefinitionError) as info:

        @participant(name="trip")
        class Trip(_Trip):
            on_booked: ClassVar[ReplyHandler] = on_reply(
                HotelBooked, step="hotel", association_property="trip_id"
            )

    text = _problems(info)
    assert "Trip.on_booked is a saga handler (on_reply(...)), and saga handlers run only in a " in (
        text
    )
    assert "Trip.on_requested is a saga handler (@saga_event_handler)" in text
    assert (
        "decorate the class with @saga(type='...') on a SagaState subclass, not @participant"
        in (text)
    )


# -- lint-saga ----------------------------------------------------------------------------------

_MODULE = """
from typing import ClassVar
from datetime import timedelta
from processor import SagaCommands, SagaDeadlines, SagaLifecycle, saga, saga_event_handler
from processor import OrchestratedSaga, Orchestration, Step, on_reply
from processor._authoring.orchestration import ReplyHandler
from schemas.orders import (
    EscalateToPerson, OrderPlaced, ReserveStock, StockReleased, StockReserved,
)

def _reserve(o):
    return ReserveStock(order_id=o.order_id, customer_id="c", sku="s", quantity=1, amount=1)

@saga(type="{name}")
class Shop(OrchestratedSaga):
    orchestration = Orchestration(
        steps=(Step("reserve", action=_reserve, {step}),),
        escalation=lambda o, e: EscalateToPerson(order_id=o.order_id, **e.model_dump()),
    )
    order_id: str = ""

    @saga_event_handler(OrderPlaced, association_property="order_id", start=True)
    def on_placed(
        self,
        event: OrderPlaced,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
    ) -> None:
        self.begin(event.order_id, commands, deadlines, lifecycle)

{replies}
"""


def _lint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, step: str, replies: str
) -> Any:
    source = _MODULE.format(name=name, step=step, replies=textwrap.indent(replies, "    "))
    (tmp_path / f"{name.replace('-', '_')}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = name.replace("-", "_")
    monkeypatch.delitem(sys.modules, module, raising=False)
    return main(["lint-saga", f"{module}:Shop", "--json"])


def test_lint_saga_reports_a_definition_that_fails_at_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    step = 'on_exhausted="escalte"'
    assert _lint(tmp_path, monkeypatch, "lint-policy", step, "") == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False
    assert out["problems"] == [
        "step 'reserve': on_exhausted='escalte' is not one of 'compensate', 'escalate', "
        "'fail'; did you mean 'escalate'?"
    ]


def test_lint_saga_reports_a_reply_kind_the_step_cannot_receive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    replies = (
        "on_reserved: ClassVar[ReplyHandler] = on_reply(StockReserved, step='reserve', "
        "association_property='order_id')\n"
        "on_released: ClassVar[ReplyHandler] = on_reply(StockReleased, step='reserve', "
        "kind='undone', association_property='order_id')\n"
    )
    step = "timeout=timedelta(seconds=5)"
    assert _lint(tmp_path, monkeypatch, "lint-undo", step, replies) == 1
    (problem,) = json.loads(capsys.readouterr().out)["problems"]
    assert problem == (
        "saga Shop: reply handler on_released reports the undo (undone) of step 'reserve', "
        "which declares no compensation"
    )


def test_lint_saga_warns_of_a_step_no_reply_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    step = "compensation=_reserve"
    replies = (
        "on_released: ClassVar[ReplyHandler] = on_reply(StockReleased, step='reserve', "
        "kind='undone', association_property='order_id')\n"
    )
    assert _lint(tmp_path, monkeypatch, "lint-silent", step, replies) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert problems == [
        "lint-silent: step 'reserve' has no on_reply(..., kind='succeeded') handler: only its "
        "timeout moves the saga on, so every run fails there"
    ]
