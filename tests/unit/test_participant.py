"""The participant kit without services: declaration checks, and what one command leaves behind."""

from __future__ import annotations

import time
from typing import Annotated

import pytest

from processor._authoring.handles import SagaCommands, Setting
from processor._authoring.messages import Message, MessageMetadata, MessageRegistry, message_type
from processor._engine.records import Record
from processor._errors import ConfigurationError, Retryable, SagaDefinitionError
from processor._memory.participant import MemoryParticipantStore
from processor.participant import (
    DROP,
    Bucket,
    CommandKit,
    Replies,
    SkipDelivery,
    Sql,
    command_handler,
    participant,
    participant_of,
)

REG = MessageRegistry()


@message_type("t.Charge", topic="cmds", registry=REG)
class Charge(Message):
    order_id: str
    cents: int


@message_type("t.Ship", topic="cmds", registry=REG)
class Ship(Message):
    order_id: str


@message_type("t.Charged", topic="events", registry=REG)
class Charged(Message):
    order_id: str
    cents: int


@message_type("t.Declined", topic="events", registry=REG)
class Declined(Message):
    order_id: str
    reason: str


class Fail(Exception):
    pass


@participant(name="billing")
class Billing:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail = False
        self.skip = False
        self.retry = False
        self.fail_for: set[str] = set()

    @command_handler(expired=lambda c: Declined(order_id=c.order_id, reason="late"))
    def charge(
        self,
        command: Charge,
        replies: Replies,
        sql: Sql,
        meta: MessageMetadata,
        limit: Annotated[int, Setting("billing.limit")],
    ) -> None:
        self.calls.append(meta.message_id)
        sql.execute("UPDATE wallet SET cents = cents - %s", (command.cents,))
        if self.fail or command.order_id in self.fail_for:
            raise Fail("boom")
        if self.skip:
            raise SkipDelivery
        if self.retry:
            raise Retryable("later")
        if command.cents > limit:
            replies.send(Declined(order_id=command.order_id, reason="over limit"))
        else:
            replies.send(Charged(order_id=command.order_id, cents=command.cents))


@participant(name="unused")
class Shipping:
    @command_handler(expired=DROP)
    def ship(self, command: Ship, replies: Replies) -> None:
        raise AssertionError("never run in these tests")


def _record(
    message: Message | None,
    mid: str = "m-1",
    offset: int = 0,
    *,
    value: bytes | None = None,
    type_name: str | None = None,
    **headers: str,
) -> Record:
    base = {
        "message-id": mid,
        "message-type": type_name or (REG.of(type(message)).name if message else "t.Charge"),
        "saga-type": "order-saga",
        "saga-id": "o-1",
        "correlation-id": "corr-1",
        **{k.replace("_", "-"): v for k, v in headers.items()},
    }
    body = value if value is not None else (message.model_dump_json().encode() if message else b"")
    return Record(
        "p.cmds", 0, offset, b"o-1", body, tuple((k, v.encode()) for k, v in base.items())
    )


@pytest.fixture
def billing() -> Billing:
    return Billing()


@pytest.fixture
def store() -> MemoryParticipantStore:
    return MemoryParticipantStore()


def _kit(store: MemoryParticipantStore, *participants: object) -> CommandKit:
    return CommandKit(
        list(participants),
        store,
        group_id="g",
        dead_letter_topic="p.dead",
        topic_prefix="p.",
        settings={"billing.limit": 100},
        message_registry=REG,
    )


def test_handled_command_leaves_inbox_reply_and_position(
    store: MemoryParticipantStore, billing: Billing
) -> None:
    kit = _kit(store, billing)
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert kit.handle(_record(Charge(order_id="o-1", cents=5), traceparent=trace)) == "handled"
    [reply] = store.tables.outbox
    assert (reply.topic, reply.key, reply.saga_type, reply.saga_id) == (
        "p.events",
        b"o-1",
        "order-saga",
        "o-1",
    )
    h = reply.headers
    assert h["message-type"] == "t.Charged"
    assert (h["correlation-id"], h["causation-id"], h["traceparent"]) == ("corr-1", "m-1", trace)
    assert store.tables.inbox["m-1"].outcome == "handled"
    assert store.tables.offsets == {("g", "p.cmds", 0): 1}
    assert store.tables.statements == [("UPDATE wallet SET cents = cents - %s", (5,))]


def test_redelivery_runs_nothing_and_sends_the_same_reply(
    store: MemoryParticipantStore, billing: Billing
) -> None:
    kit = _kit(store, billing)
    kit.handle(_record(Charge(order_id="o-1", cents=5)))
    assert kit.handle(_record(Charge(order_id="o-1", cents=5), offset=7)) == "duplicate"
    first, again = store.tables.outbox
    assert again == first
    assert billing.calls == ["m-1"]
    assert len(store.tables.statements) == 1
    assert store.tables.offsets[("g", "p.cmds", 0)] == 8


def test_expired_command_gets_the_declared_reply_or_nothing(
    store: MemoryParticipantStore, billing: Billing
) -> None:
    kit = _kit(store, billing)
    past = str(int(time.time() * 1000) - 1)
    assert kit.handle(_record(Charge(order_id="o-1", cents=5), deadline_unix_ms=past)) == "expired"
    [reply] = store.tables.outbox
    assert reply.headers["message-type"] == "t.Declined"
    assert reply.headers["causation-id"] == "m-1"
    assert billing.calls == []
    future = str(int(time.time() * 1000) + 60_000)
    assert kit.handle(_record(Charge(order_id="o-1", cents=5), "m-2", deadline_unix_ms=future))
    assert billing.calls == ["m-2"]


def test_expired_command_declared_drop_is_answered_by_nothing(
    store: MemoryParticipantStore,
) -> None:
    @participant(name="shipping")
    class Quiet:
        @command_handler(expired=DROP)
        def ship(self, command: Ship, replies: Replies) -> None:
            replies.send(Charged(order_id=command.order_id, cents=0))

    kit = _kit(store, Quiet)
    past = str(int(time.time() * 1000) - 1)
    assert kit.handle(_record(Ship(order_id="o-1"), deadline_unix_ms=past)) == "dropped"
    assert store.tables.outbox == []
    assert store.tables.inbox["m-1"].outcome == "dropped"


def test_failing_handler_is_rolled_back_and_dead_lettered_once(
    store: MemoryParticipantStore, billing: Billing
) -> None:
    kit = _kit(store, billing)
    billing.fail = True
    assert kit.handle(_record(Charge(order_id="o-1", cents=5))) == "dead-lettered"
    assert kit.handle(_record(Charge(order_id="o-1", cents=5), offset=1)) == "duplicate"
    [dead] = store.tables.outbox
    assert dead.topic == "p.dead"
    assert dead.headers["dead-letter-reason"] == "handler-failed"
    assert dead.headers["source-offset"] == "0"
    assert store.tables.statements == []  # the handler's statement rolled back


def test_retryable_failure_commits_nothing(store: MemoryParticipantStore, billing: Billing) -> None:
    kit = _kit(store, billing)
    billing.retry = True
    with pytest.raises(Retryable):
        kit.handle(_record(Charge(order_id="o-1", cents=5)))
    assert (store.tables.inbox, store.tables.outbox, store.tables.offsets) == ({}, [], {})


def test_skipped_delivery_is_handled_afresh_next_time(
    store: MemoryParticipantStore, billing: Billing
) -> None:
    kit = _kit(store, billing)
    billing.skip = True
    assert kit.handle(_record(Charge(order_id="o-1", cents=5))) == "skipped"
    assert store.tables.inbox == {}
    billing.skip = False
    assert kit.handle(_record(Charge(order_id="o-1", cents=5), offset=1)) == "handled"


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (_record(None, value=b"{not json"), "unparseable"),
        (_record(None, value=b"{}", type_name="t.Nope"), "unknown-type"),
        (_record(Charge(order_id="o", cents=1), deadline_unix_ms="soon"), "invalid-header"),
        (_record(None, value=b'{"order_id": 1}'), "schema-violation"),
    ],
)
def test_unreadable_commands_are_dead_lettered(
    store: MemoryParticipantStore, billing: Billing, record: Record, reason: str
) -> None:
    kit = _kit(store, billing)
    assert kit.handle(record) == "dead-lettered"
    [dead] = store.tables.outbox
    assert dead.headers["dead-letter-reason"] == reason
    assert dead.value == record.value
    assert billing.calls == []


def _batch() -> list[Record]:
    return [
        _record(Charge(order_id="o-1", cents=5), "m-1", 0),
        _record(Ship(order_id="o-1"), "m-2", 1),  # another participant's: passed over
        _record(Charge(order_id="o-2", cents=500), "m-3", 2),
        _record(Charge(order_id="o-1", cents=5), "m-1", 3),  # the first one delivered again
        _record(Charge(order_id="o-3", cents=7), "m-4", 4),
    ]


def test_a_batch_of_commands_commits_once(store: MemoryParticipantStore, billing: Billing) -> None:
    kit = _kit(store, billing)
    assert kit.handle_together(_batch())
    assert store.commits == 1
    assert billing.calls == ["m-1", "m-3", "m-4"]
    # In order, the duplicate's reply sent again under the first one's message id.
    replies = store.tables.outbox
    assert [r.headers["message-type"] for r in replies] == [
        "t.Charged",
        "t.Declined",
        "t.Charged",
        "t.Charged",
    ]
    assert replies[2] == replies[0]
    assert store.tables.offsets == {("g", "p.cmds", 0): 5}
    c = kit.counters
    assert (c.handled, c.duplicates, c.not_handled, c.replies) == (3, 1, 1, 4)


def test_a_failing_handler_sends_the_batch_back_to_a_transaction_per_command(
    store: MemoryParticipantStore, billing: Billing
) -> None:
    kit = _kit(store, billing)
    billing.fail_for = {"o-2"}
    records = _batch()
    assert not kit.handle_together(records)
    # Rolled back whole, counters included.
    assert (store.commits, store.tables.outbox, store.tables.offsets) == (0, [], {})
    assert kit.counters.handled == kit.counters.replies == 0
    outcomes = [kit.handle(r) for r in records]
    assert outcomes == ["handled", "not-handled", "dead-lettered", "duplicate", "handled"]
    assert [r.topic for r in store.tables.outbox] == ["p.events", "p.dead", "p.events", "p.events"]
    assert store.tables.offsets == {("g", "p.cmds", 0): 5}
    assert kit.counters.handled == 2


def test_a_record_to_dead_letter_sends_the_batch_apart(
    store: MemoryParticipantStore, billing: Billing
) -> None:
    kit = _kit(store, billing)
    records = [*_batch()[:2], _record(None, "m-9", 5, value=b"{not json")]
    assert not kit.handle_together(records)
    assert (store.commits, store.tables.inbox) == (0, {})
    assert [kit.handle(r) for r in records] == ["handled", "not-handled", "dead-lettered"]


def test_a_retryable_failure_in_a_batch_commits_nothing(
    store: MemoryParticipantStore, billing: Billing
) -> None:
    kit = _kit(store, billing)
    billing.retry = True
    with pytest.raises(Retryable):
        kit.handle_together(_batch())
    assert (store.tables.inbox, store.tables.outbox, store.tables.offsets) == ({}, [], {})
    assert kit.counters.handled == 0


def test_a_registered_command_for_another_participant_is_passed_over(
    store: MemoryParticipantStore, billing: Billing
) -> None:
    kit = _kit(store, billing)
    assert kit.handle(_record(Ship(order_id="o-1"))) == "not-handled"
    assert store.tables.outbox == []
    assert store.tables.offsets == {("g", "p.cmds", 0): 1}


def test_declaration_problems_are_listed_at_once() -> None:
    with pytest.raises(SagaDefinitionError) as err:

        @participant(name="")
        class Broken:
            @command_handler()
            def a(self, command: Charge, commands: SagaCommands) -> None: ...

            @command_handler(Charge)
            def b(self, command: Charge) -> None: ...

            @command_handler(expired="ignore")  # type: ignore[call-overload, untyped-decorator]
            def c(self, command: Ship) -> None: ...

    text = str(err.value)
    assert "non-empty name" in text
    assert "saga handle" in text
    assert "two handlers" in text
    assert "expired=" in text


class Clock:
    """A dependency nobody registers."""


def test_unresolvable_parameters_fail_at_start(store: MemoryParticipantStore) -> None:
    @participant(name="needs")
    class Needs:
        @command_handler()
        def a(self, command: Charge, clock: Clock) -> None: ...

    with pytest.raises(ConfigurationError, match="needs a dependency of type"):
        _kit(store, Needs)
    with pytest.raises(ConfigurationError, match=r"billing\.limit"):
        CommandKit([Billing()], store, group_id="g", dead_letter_topic="d", message_registry=REG)
    assert participant_of(Needs).name == "needs"


def test_a_handler_asking_for_its_bucket_gets_0_off_buckets(
    store: MemoryParticipantStore,
) -> None:
    seen: list[object] = []

    @participant(name="holder")
    class Holder:
        @command_handler
        def hold(self, command: Ship, bucket: Bucket) -> None:
            seen.append(bucket)

    kit = _kit(store, Holder())
    assert kit.handle(_record(Ship(order_id="o-1"))) == "handled"
    assert seen == [0]
    assert isinstance(seen[0], Bucket)
