"""@saga validates the whole class at import and lists every problem in one error."""

from datetime import timedelta
from typing import Annotated, Any

import pytest

from processor import (
    Message,
    MessageMetadata,
    SagaCommands,
    SagaDeadlines,
    SagaDefinitionError,
    SagaLifecycle,
    SagaState,
    Setting,
    message_type,
    saga,
    saga_deadline_handler,
    saga_event_handler,
)
from processor._authoring.definition import definition_of


@message_type("test.definition.Opened")
class Opened(Message):
    case_id: str
    note: str | None = None


@message_type("test.definition.Closed")
class Closed(Message):
    case_id: str


class Clock:
    pass


class Reminder(Message):
    text: str


def test_parameters_are_resolved_by_type_in_any_order() -> None:
    @saga(type="case")
    class Case(SagaState):
        case_id: str = ""

        @saga_event_handler(Opened, association_property="case_id", start=True)
        def opened(  # parameters in no particular order: resolved by type
            self,
            clock: Clock,
            deadlines: SagaDeadlines,
            limit: Annotated[int, Setting("case.limit")],
            meta: MessageMetadata,
            evt: Opened,
            commands: SagaCommands,
            lifecycle: SagaLifecycle,
        ) -> None: ...

        @saga_deadline_handler("remind", end=True)
        def remind(self, lifecycle: SagaLifecycle, reminder: Reminder | None = None) -> None: ...

    d = definition_of(Case)
    handler = d.event_handlers[Opened]
    assert [(p.name, p.kind) for p in handler.params] == [
        ("clock", "dependency"),
        ("deadlines", "deadlines"),
        ("limit", "setting"),
        ("meta", "metadata"),
        ("evt", "event"),
        ("commands", "commands"),
        ("lifecycle", "lifecycle"),
    ]
    assert handler.params[2].setting_key == "case.limit"
    assert handler.params[2].annotation is int
    assert (handler.start, handler.end, handler.association_property) == (True, False, "case_id")
    remind = d.deadline_handlers["remind"]
    assert [(p.name, p.kind, p.optional) for p in remind.params] == [
        ("lifecycle", "lifecycle", False),
        ("reminder", "payload", True),
    ]
    assert remind.params[1].annotation is Reminder
    assert remind.end
    assert remind.key == "remind"
    assert d.saga_type == "case"
    assert d.state_cls is Case


def test_event_type_is_inferred_from_the_single_message_parameter() -> None:
    @saga(saga_type="inferred")
    class Inferred(SagaState):
        @saga_event_handler(association_property="case_id", start=True)
        def opened(self, commands: SagaCommands, event: Opened) -> None: ...

    d = definition_of(Inferred)
    assert d.handles(Opened)
    assert not d.handles(Closed)
    assert d.event_handlers[Opened].name == "opened"


def test_every_problem_is_listed_in_one_error() -> None:
    with pytest.raises(SagaDefinitionError) as info:

        @saga(type="broken")
        class Broken(SagaState):
            required_field: int

            @saga_event_handler(Opened, association_property="nope")
            def first(self, event: Opened) -> None: ...

            @saga_event_handler(Opened, association_property="case_id")
            def second(self, event: Opened) -> None: ...

            @saga_event_handler(Closed, association_property="case_id")
            def unannotated(self, event: Closed, mystery) -> None:  # type: ignore[no-untyped-def]
                ...

            @saga_deadline_handler("t")
            def t1(self) -> None: ...

            @saga_deadline_handler("t")
            def t2(self, meta: MessageMetadata) -> None: ...

    text = str(info.value)
    problems = info.value.problems
    assert "field 'required_field' needs a default" in text
    assert "association_property 'nope' is not a field of Opened" in text
    assert "event Opened has two handlers (first, second)" in text
    assert "parameter 'mystery' has no type annotation" in text
    assert "deadline 't' has two handlers (t1, t2)" in text
    assert "a deadline is a timer, not a message" in text
    assert "saga state" in text
    assert "no start handler" in text
    assert len(problems) == 7
    # One line per problem so the message reads as a checklist.
    assert all(f"  - {p}" in text.splitlines() for p in problems)


def test_event_parameter_problems() -> None:
    with pytest.raises(SagaDefinitionError) as info:

        @saga(type="bad-events")
        class BadEvents(SagaState):
            @saga_event_handler(Opened, association_property="case_id", start=True)
            def none(self, commands: SagaCommands) -> None: ...

            @saga_event_handler(association_property="case_id")
            def two(self, a: Opened, b: Closed) -> None: ...

            @saga_event_handler(Closed, association_property="case_id")
            def mismatch(self, event: Opened) -> None: ...

            @saga_event_handler(Reminder, association_property="case_id")
            def unknown_prop(self, event: Reminder) -> None: ...

    text = str(info.value)
    assert "add a parameter annotated with Opened" in text
    assert "several parameters ('a', 'b') are messages" in text
    assert "annotated Opened but the handler is declared for Closed" in text
    assert "'case_id' is not a field of Reminder (fields: text)" in text
    assert len(info.value.problems) == 4


def test_signature_and_decorator_argument_problems() -> None:
    with pytest.raises(SagaDefinitionError) as info:

        @saga(type="")
        class Odd(SagaState):
            @saga_event_handler(Opened, association_property="case_id", start=True)
            async def coro(self, event: Opened) -> None: ...

            @saga_event_handler(int, association_property="")  # type: ignore[arg-type]
            def not_message(self, event: Closed) -> None: ...

            @saga_deadline_handler("")
            def unnamed(self, *args: Any) -> None: ...

            @saga_deadline_handler("x")
            @saga_event_handler(Closed, association_property="case_id")
            def twice(self, event: Closed) -> None: ...

    text = str(info.value)
    assert "non-empty type name" in text
    assert "plain synchronous functions" in text
    assert "the event type <class 'int'> must be a Message subclass" in text
    assert "association_property must name a field" in text
    assert "deadline name must be a non-empty string" in text
    assert "*args/**kwargs" in text
    assert "carries 2 handler decorators" in text


def test_saga_must_subclass_saga_state() -> None:
    with pytest.raises(SagaDefinitionError, match=r"must subclass processor\.SagaState"):

        @saga(type="plain")
        class Plain:  # type: ignore[type-var]
            pass


def test_conflicting_type_arguments_are_rejected() -> None:
    with pytest.raises(SagaDefinitionError, match="either type= or saga_type="):

        @saga(type="a", saga_type="b")
        class Twice(SagaState):
            @saga_event_handler(Opened, association_property="case_id", start=True)
            def opened(self, event: Opened) -> None: ...


def test_unresolvable_annotation_is_reported() -> None:
    with pytest.raises(SagaDefinitionError, match="cannot resolve annotations"):

        @saga(type="fwd")
        class Fwd(SagaState):
            @saga_event_handler(Opened, association_property="case_id", start=True)
            def opened(self, event: "Opened", thing: "DoesNotExist") -> None: ...  # type: ignore[name-defined]  # noqa: F821


def test_definition_of_a_non_saga_and_of_a_saga_subclass() -> None:
    @saga(type="base")
    class Base(SagaState):
        @saga_event_handler(Opened, association_property="case_id", start=True)
        def opened(self, event: Opened) -> None: ...

    class Sub(Base):
        pass

    assert definition_of(Base).saga_type == "base"
    with pytest.raises(SagaDefinitionError, match="not a saga"):
        definition_of(Sub)


def test_subclass_override_replaces_the_inherited_handler() -> None:
    class Base(SagaState):
        @saga_event_handler(Opened, association_property="case_id", start=True)
        def opened(self, event: Opened) -> None: ...

    @saga(type="derived")
    class Derived(Base):
        @saga_event_handler(Opened, association_property="case_id", start=True, end=True)
        def opened(self, event: Opened, commands: SagaCommands) -> None: ...  # type: ignore[override]

    handler = definition_of(Derived).event_handlers[Opened]
    assert handler.end
    assert handler.func is Derived.__dict__["opened"]


def test_association_value() -> None:
    @saga(type="assoc")
    class Assoc(SagaState):
        @saga_event_handler(Opened, association_property="note", start=True)
        def opened(self, event: Opened) -> None: ...

        @saga_deadline_handler("later")
        def later(self, after: timedelta | None = None) -> None: ...

    d = definition_of(Assoc)
    assert d.association_value(Opened(case_id="c", note="n-1")) == "n-1"
    assert d.association_value(Opened(case_id="c", note=None)) is None
    assert d.association_value(Opened(case_id="c", note="")) is None
    assert d.association_value(Closed(case_id="c")) is None
    assert [h.name for h in d.handlers] == ["opened", "later"]


def test_decorating_a_non_function_fails_immediately() -> None:
    with pytest.raises(SagaDefinitionError, match="plain methods"):
        saga_deadline_handler("x")(staticmethod(lambda: None))
