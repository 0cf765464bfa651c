"""The pure runner: (state, input, now) -> outcome, with intents recorded, never performed."""

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import BaseModel, Field, PrivateAttr, ValidationError

from processor import (
    HandlerError,
    Message,
    MessageMetadata,
    SagaCommands,
    SagaDeadlines,
    SagaError,
    SagaLifecycle,
    SagaState,
    message_type,
    saga,
    saga_deadline_handler,
    saga_event_handler,
)
from processor._authoring.handles import CancelDeadline, ScheduleDeadline
from processor._errors import SagaNotStarted
from processor._invocation import (
    BoundSaga,
    DeadlineInput,
    EventInput,
    Outcome,
    bind,
    command_message_id,
    state_to_json,
    working_copy,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@message_type("test.runner.Begin")
class Begin(Message):
    order_id: str
    items: list[str] = Field(default_factory=list)


@message_type("test.runner.Step")
class Step(Message):
    order_id: str
    action: str


@message_type("test.runner.Ship", topic="shipping")
class Ship(Message):
    order_id: str


class Unrouted(Message):
    order_id: str


class Reminder(BaseModel):
    attempt: int
    at: datetime


class Boom(Exception):
    pass


@saga(type="order")
class Order(SagaState):
    order_id: str = ""
    items: list[str] = Field(default_factory=list)
    seen_message_ids: list[str] = Field(default_factory=list)
    reminded: int = 0

    @saga_event_handler(Begin, association_property="order_id", start=True)
    def begin(self, event: Begin, meta: MessageMetadata, deadlines: SagaDeadlines) -> None:
        self.order_id = event.order_id
        self.items = list(event.items)
        self.seen_message_ids = [meta.message_id]
        deadlines.schedule("remind", timedelta(minutes=5), Reminder(attempt=1, at=NOW))

    @saga_event_handler(Step, association_property="order_id")
    def step(
        self,
        event: Step,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
    ) -> None:
        self.items.append("touched")  # mutate in place before a possible failure
        if event.action == "raise":
            raise Boom("halfway")
        if event.action == "ship":
            commands.send(Ship(order_id=self.order_id))
            commands.send(
                Ship(order_id="other"),
                topic="priority",
                key="k-1",
                headers={"x-tenant": "t1"},
                deadline=datetime(2026, 3, 1, 13, 0, tzinfo=timezone(timedelta(hours=1))),
            )
        if event.action == "deadlines":
            deadlines.schedule("remind", timedelta(minutes=1))
            deadlines.cancel("gone")
            deadlines.schedule("remind", at=NOW + timedelta(hours=2), payload={"attempt": 9})
        if event.action == "finish":
            lifecycle.end()
        if event.action == "rogue-deadline":
            deadlines.schedule("nobody-handles-this", timedelta(seconds=1))
        if event.action == "bad-assignment":
            self.reminded = "many"  # type: ignore[assignment]

    @saga_deadline_handler("remind")
    def remind(self, reminder: Reminder | None = None) -> None:
        self.reminded = reminder.attempt if reminder else -1

    @saga_deadline_handler("strict", end=True)
    def strict(self, reminder: Reminder) -> None:
        self.reminded = reminder.attempt


def _meta(message_id: str = "m-1") -> MessageMetadata:
    return MessageMetadata(message_id, "t", None, None, None, "orders", 0, 0, "o-1")


def _order(outcome: Outcome) -> Order:
    assert isinstance(outcome.state, Order)
    return outcome.state


def _started() -> tuple[BoundSaga, Order]:
    bound = bind(Order)
    outcome = bound.handle_event(None, "o-1", EventInput(Begin(order_id="o-1"), _meta()), NOW)
    assert isinstance(outcome.state, Order)
    return bound, outcome.state


def _step(action: str, state: Order) -> Outcome:
    event = EventInput(Step(order_id="o-1", action=action), _meta())
    return bind(Order).handle_event(state, "o-1", event, NOW)


def test_start_creates_a_new_state_and_records_a_deadline_with_json_payload() -> None:
    bound = bind(Order)
    outcome = bound.handle_event(
        None, "o-1", EventInput(Begin(order_id="o-1", items=["a"]), _meta("m-9")), NOW
    )
    assert outcome.state == Order(order_id="o-1", items=["a"], seen_message_ids=["m-9"])
    assert outcome.handler_name == "begin"
    assert not outcome.ended
    assert outcome.commands == []
    assert outcome.deadlines == [
        ScheduleDeadline(
            "remind", NOW + timedelta(minutes=5), {"attempt": 1, "at": "2026-03-01T12:00:00Z"}
        )
    ]


def test_non_start_event_without_state_is_rejected() -> None:
    bound = bind(Order)
    with pytest.raises(SagaNotStarted, match="does not start it"):
        bound.handle_event(None, "o-1", EventInput(Step(order_id="o-1", action=""), _meta()), NOW)


def test_a_raising_handler_leaves_the_callers_state_untouched() -> None:
    bound, state = _started()
    before = state.model_copy(deep=True)
    with pytest.raises(HandlerError) as info:
        bound.handle_event(
            state, "o-1", EventInput(Step(order_id="o-1", action="raise"), _meta()), NOW
        )
    err = info.value
    assert (err.saga_type, err.saga_id, err.handler_name) == ("order", "o-1", "step")
    assert isinstance(err.cause, Boom)
    assert err.__cause__ is err.cause
    # The text a parked saga's reason shows: the code's own message (a pydantic error, whose
    # text echoes payload values, is reduced to where it failed: test_plan's unstorable cases).
    assert "raised Boom: halfway" in str(err)
    assert state == before
    assert state.items == []


def test_successful_handler_returns_a_copy() -> None:
    _, state = _started()
    outcome = _step("noop", state)
    assert _order(outcome).items == ["touched"]
    assert state.items == []


def test_invalid_state_assignment_is_a_handler_error() -> None:
    _, state = _started()
    with pytest.raises(HandlerError) as info:
        _step("bad-assignment", state)
    assert type(info.value.cause).__name__ == "ValidationError"


def test_commands_default_to_registered_topic_and_saga_id_key() -> None:
    _, state = _started()
    first, second = _step("ship", state).commands
    assert (first.message, first.topic, first.key) == (Ship(order_id="o-1"), "shipping", "o-1")
    assert dict(first.headers) == {}
    assert first.deadline_unix_ms is None
    assert (second.topic, second.key, dict(second.headers)) == (
        "priority",
        "k-1",
        {"x-tenant": "t1"},
    )
    # 13:00 at UTC+1 is 12:00 UTC.
    assert second.deadline_unix_ms == int(NOW.timestamp() * 1000)


def test_send_errors_name_the_fix() -> None:
    commands = SagaCommands("s-1")
    with pytest.raises(SagaError, match=r"pass topic=\.\.\. or register"):
        commands.send(Unrouted(order_id="x"))
    with pytest.raises(SagaError, match="timezone-aware"):
        commands.send(Ship(order_id="x"), deadline=datetime(2026, 1, 1))
    with pytest.raises(SagaError, match="Message instance"):
        commands.send({"order_id": "x"})  # type: ignore[arg-type]
    commands.send(Unrouted(order_id="x"), topic="explicit")
    assert [i.topic for i in commands.intents] == ["explicit"]


def test_deadline_operations_are_recorded_in_order_and_last_schedule_wins() -> None:
    _, state = _started()
    outcome = _step("deadlines", state)
    assert outcome.deadlines == [
        CancelDeadline("gone"),
        ScheduleDeadline("remind", NOW + timedelta(hours=2), {"attempt": 9}),
    ]


def test_schedule_argument_errors() -> None:
    deadlines = SagaDeadlines(NOW)
    with pytest.raises(SagaError, match="exactly one of"):
        deadlines.schedule("x")
    with pytest.raises(SagaError, match="exactly one of"):
        deadlines.schedule("x", timedelta(1), at=NOW)
    with pytest.raises(SagaError, match="use at=datetime"):
        deadlines.schedule("x", NOW)  # type: ignore[arg-type]
    with pytest.raises(SagaError, match="timezone-aware"):
        deadlines.schedule("x", at=datetime(2026, 1, 1))
    with pytest.raises(SagaError, match="not serialisable"):
        deadlines.schedule("x", timedelta(1), payload=object())
    with pytest.raises(SagaError, match="non-empty"):
        deadlines.cancel("")
    assert deadlines.operations == []


def test_cancel_then_reschedule_keeps_both_in_order() -> None:
    deadlines = SagaDeadlines(NOW)
    deadlines.schedule("a", timedelta(minutes=1))
    deadlines.cancel("a")
    deadlines.schedule("a", timedelta(minutes=2))
    assert deadlines.operations == [
        CancelDeadline("a"),
        ScheduleDeadline("a", NOW + timedelta(minutes=2), None),
    ]


def test_scheduling_a_deadline_without_handler_fails_at_schedule_time() -> None:
    _, state = _started()
    with pytest.raises(HandlerError) as info:
        _step("rogue-deadline", state)
    assert "no @saga_deadline_handler('nobody-handles-this')" in str(info.value.cause)


def test_end_by_lifecycle_and_by_declaration() -> None:
    bound, state = _started()
    assert _step("finish", state).ended
    assert not _step("noop", state).ended
    outcome = bound.handle_deadline(
        state,
        "o-1",
        DeadlineInput("strict", "d-1", {"attempt": 4, "at": "2026-03-01T12:00:00Z"}, NOW),
        NOW,
    )
    assert outcome.ended
    assert _order(outcome).reminded == 4


def test_deadline_payload_is_decoded_into_the_declared_type() -> None:
    bound, state = _started()
    payload = {"attempt": 2, "at": "2026-03-01T12:00:00Z"}
    outcome = bound.handle_deadline(state, "o-1", DeadlineInput("remind", "d", payload, NOW), NOW)
    assert _order(outcome).reminded == 2
    absent = bound.handle_deadline(state, "o-1", DeadlineInput("remind", "d", None, NOW), NOW)
    assert _order(absent).reminded == -1


def test_bad_or_missing_required_payload_is_a_handler_error() -> None:
    bound, state = _started()
    with pytest.raises(HandlerError, match="strict"):
        bound.handle_deadline(state, "o-1", DeadlineInput("strict", "d", None, NOW), NOW)
    with pytest.raises(HandlerError) as info:
        bound.handle_deadline(
            state, "o-1", DeadlineInput("strict", "d", {"attempt": "x"}, NOW), NOW
        )
    assert "does not fit 'reminder'" in str(info.value.cause)


def test_unknown_deadline_or_event_is_a_saga_error() -> None:
    bound, state = _started()
    with pytest.raises(SagaError, match="no handler for deadline 'nope'"):
        bound.handle_deadline(state, "o-1", DeadlineInput("nope", "d", None, NOW), NOW)
    with pytest.raises(SagaError, match="no handler for Ship"):
        bound.handle_event(state, "o-1", EventInput(Ship(order_id="o-1"), _meta()), NOW)


def test_state_json_round_trip() -> None:
    bound, state = _started()
    data = state_to_json(state)
    assert data == {
        "order_id": "o-1",
        "items": [],
        "seen_message_ids": ["m-1"],
        "reminded": 0,
    }
    assert bound.state_from_json(data) == state


def test_command_message_id_is_stable_and_distinct() -> None:
    a = command_message_id("order", "o-1", 1)
    assert a == command_message_id("order", "o-1", 1)
    assert uuid.UUID(a).version == 5
    others = {
        command_message_id("order", "o-1", 2),
        command_message_id("order", "o-2", 1),
        command_message_id("orders", "o-1", 1),
        command_message_id("order-o", "1", 1),
    }
    assert a not in others
    assert len(others) == 4


def test_intents_built_without_their_constructors_equal_constructed_ones() -> None:
    # send() and schedule() fill the frozen intents' __dict__ directly (a hot path): no field
    # may be missed, and the intents stay frozen to whoever reads them back.
    commands = SagaCommands("s-1")
    commands.send(Ship(order_id="x"))
    commands.send(Ship(order_id="y"), key="k", headers={"h": "v"}, deadline=NOW)
    deadlines = SagaDeadlines(NOW)
    deadlines.schedule("a", timedelta(minutes=1), payload={"attempt": 2})
    for made in [*commands.intents, *deadlines.operations]:
        fields = {f.name: getattr(made, f.name) for f in dataclasses.fields(made)}
        built = type(made)(**fields)
        assert made == built
        assert vars(made).keys() == vars(built).keys()
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.name = "other"  # type: ignore[misc,union-attr]
    first, second = commands.intents
    assert dict(first.headers) == {}
    assert dict(second.headers) == {"h": "v"}
    with pytest.raises(TypeError):
        first.headers["x"] = "y"  # type: ignore[index]


class _Nested(BaseModel):
    tags: list[str] = Field(default_factory=list)


class _Copied(SagaState):
    name: str = ""
    when: datetime | None = None
    tags: list[str] = Field(default_factory=list)
    other: list[str] = Field(default_factory=list)
    nested: _Nested = Field(default_factory=_Nested)


class _WithPrivate(SagaState):
    tags: list[str] = Field(default_factory=list)
    _cache: dict[str, int] = PrivateAttr(default_factory=dict)


def test_a_working_copy_is_a_deep_copy_that_shares_only_immutable_values() -> None:
    shared = ["a"]
    state = _Copied(name="n", when=NOW, nested=_Nested(tags=["x"]))
    state.tags = state.other = shared  # two fields, one list (validation would copy it)
    copied = working_copy(state)
    assert copied == state.model_copy(deep=True)
    assert copied.model_fields_set == state.model_fields_set
    assert copied.name is state.name
    assert copied.when is state.when
    assert copied.tags is not state.tags
    assert copied.nested is not state.nested
    assert copied.nested.tags is not state.nested.tags
    # Aliasing survives, as in one deep copy of the whole state.
    assert copied.tags is copied.other
    copied.tags.append("b")
    copied.nested.tags.append("y")
    assert state.tags == ["a"]
    assert state.nested.tags == ["x"]


def test_a_state_with_private_attributes_is_copied_by_pydantic() -> None:
    state = _WithPrivate(tags=["a"])
    state._cache["k"] = 1
    copied = working_copy(state)
    assert copied._cache == {"k": 1}
    assert copied._cache is not state._cache
    assert copied.tags == ["a"]
    assert copied.tags is not state.tags


def test_a_handler_error_says_what_a_parked_reason_says_without_payload_values() -> None:
    class Card(BaseModel):
        number: int

    try:
        Card.model_validate({"number": "4111-secret"})
    except ValidationError as e:
        err = HandlerError("order", "o-1", "step", e)
    text = str(err)
    assert "raised ValidationError at number:" in text
    assert "4111-secret" not in text
