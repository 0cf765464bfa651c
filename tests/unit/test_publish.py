"""The event publisher's records: every header the processor reads, and the key from the sagas."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from processor._authoring.definition import SagaState, saga, saga_event_handler
from processor._authoring.messages import Message, MessageRegistry, message_type
from processor._engine.decode import MAX_ID_BYTES, Event, decode
from processor._engine.records import Record
from processor._errors import UnknownMessageType
from processor._kafka.tracked import FailedDelivery
from processor.publish import EventPublisher, EventRecordBuilder, PublishFailed

REG = MessageRegistry()


@message_type("unit.publish.Opened", version=3, topic="accounts", registry=REG)
class Opened(Message):
    account_id: str
    owner: str


@message_type("unit.publish.Linked", topic="accounts", registry=REG)
class Linked(Message):
    account_id: str
    partner_id: str


@message_type("unit.publish.Untopical", registry=REG)
class Untopical(Message):
    account_id: str


class NotRegistered(Message):
    account_id: str


@saga(type="unit-account")
class AccountSaga(SagaState):
    @saga_event_handler(Opened, association_property="account_id", start=True)
    def opened(self, event: Opened) -> None: ...

    @saga_event_handler(Linked, association_property="account_id")
    def linked(self, event: Linked) -> None: ...


@saga(type="unit-partner")
class PartnerSaga(SagaState):
    @saga_event_handler(Linked, association_property="partner_id", start=True)
    def linked(self, event: Linked) -> None: ...


@saga(type="unit-owner")
class OwnerSaga(SagaState):
    @saga_event_handler(Opened, association_property="account_id", start=True)
    def opened(self, event: Opened) -> None: ...


def _builder(*sagas: type[SagaState], prefix: str = "") -> EventRecordBuilder:
    return EventRecordBuilder(topic_prefix=prefix, sagas=sagas, registry=REG)


def test_a_record_carries_every_header_the_processor_reads() -> None:
    at = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    row = _builder(AccountSaga, prefix="staging.").build(
        Opened(account_id="a-1", owner="Ada"),
        message_id="m-1",
        correlation_id="c-1",
        causation_id="x-1",
        occurred_at=at,
        headers={"tenant": "t-9"},
    )
    assert row.topic == "staging.accounts"
    assert row.key == b"a-1"
    assert row.value == b'{"account_id":"a-1","owner":"Ada"}'
    assert row.headers == {
        "tenant": "t-9",
        "message-id": "m-1",
        "message-type": "unit.publish.Opened",
        "schema-version": "3",
        "correlation-id": "c-1",
        "causation-id": "x-1",
        "occurred-at": "2026-03-04T05:06:07+00:00",
    }
    # The outbox orders rows by (saga type, key): the saga's own events stay in order.
    assert (row.saga_type, row.saga_id) == ("unit-account", "a-1")


def test_defaults_a_new_message_id_that_also_names_the_conversation() -> None:
    before = datetime.now(UTC)
    row = _builder().build(Opened(account_id="a-1", owner="Ada"), key="k-1")
    message_id = row.headers["message-id"]
    assert uuid.UUID(message_id)
    assert row.headers["correlation-id"] == message_id
    assert "causation-id" not in row.headers
    assert datetime.fromisoformat(row.headers["occurred-at"]) >= before
    # Without a saga that handles it, the outbox orders by topic and key.
    assert (row.saga_type, row.saga_id) == ("accounts", "k-1")


def test_the_processor_decodes_the_record_as_published() -> None:
    row = _builder(AccountSaga).build(Opened(account_id="a-1", owner="Ada"), correlation_id="c-1")
    record = Record(
        row.topic, 0, 7, row.key, row.value, tuple((k, v.encode()) for k, v in row.headers.items())
    )
    decoded = decode(record, REG, 1_000_000)
    assert isinstance(decoded, Event), decoded
    assert decoded.message == Opened(account_id="a-1", owner="Ada")
    assert decoded.metadata.message_id == row.headers["message-id"]
    assert decoded.metadata.correlation_id == "c-1"
    assert decoded.metadata.occurred_at is not None


def test_the_key_is_the_association_value_of_the_sagas_that_handle_the_type() -> None:
    builder = _builder(AccountSaga, OwnerSaga)
    assert builder.build(Opened(account_id="a-7", owner="Bo")).key == b"a-7"
    # An explicit key wins.
    assert builder.build(Opened(account_id="a-7", owner="Bo"), key="other").key == b"other"


def test_no_saga_for_the_type_asks_for_a_key() -> None:
    with pytest.raises(ValueError, match=r"no saga given handles unit\.publish\.Opened .*key="):
        _builder().build(Opened(account_id="a-1", owner="Ada"))
    with pytest.raises(ValueError, match=r"unit\.publish\.Untopical"):
        _builder(AccountSaga).key_for(Untopical(account_id="a-1"))


def test_sagas_that_read_different_keys_ask_for_a_key() -> None:
    event = Linked(account_id="a-1", partner_id="p-1")
    with pytest.raises(ValueError, match=r"different keys .*unit-account, unit-partner.*key="):
        _builder(AccountSaga, PartnerSaga).build(event)
    # The same value under two properties is one key.
    assert (
        _builder(AccountSaga, PartnerSaga).build(Linked(account_id="same", partner_id="same")).key
        == b"same"
    )


def test_an_empty_association_value_asks_for_a_key() -> None:
    with pytest.raises(ValueError, match=r"account_id.*unit-account.*empty; pass key="):
        _builder(AccountSaga).build(Opened(account_id="", owner="Ada"))


def test_records_the_processor_would_refuse_are_refused_here() -> None:
    builder = _builder()
    opened = Opened(account_id="a-1", owner="Ada")
    with pytest.raises(ValueError, match="the key holds a NUL"):
        builder.build(opened, key="a\x00b")
    with pytest.raises(ValueError, match=f"message id is over {MAX_ID_BYTES} bytes"):
        builder.build(opened, key="a", message_id="m" * (MAX_ID_BYTES + 1))
    with pytest.raises(ValueError, match="the key is empty"):
        builder.build(opened, key="")
    with pytest.raises(ValueError, match="'note' holds a NUL"):
        builder.build(opened, key="a", headers={"note": "x\x00"})
    with pytest.raises(ValueError, match="use message_id="):
        builder.build(opened, key="a", headers={"message-id": "m-2"})
    with pytest.raises(ValueError, match="time zone"):
        builder.build(opened, key="a", occurred_at=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match=r"unit\.publish\.Untopical has no topic"):
        builder.build(Untopical(account_id="a-1"), key="a")
    assert builder.build(Untopical(account_id="a-1"), key="a", topic="elsewhere").topic == (
        "elsewhere"
    )
    with pytest.raises(UnknownMessageType):
        builder.build(NotRegistered(account_id="a-1"), key="a")


TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7


def test_the_active_span_is_the_trace_context() -> None:
    builder = _builder()
    opened = Opened(account_id="a-1", owner="Ada")
    assert "traceparent" not in builder.build(opened, key="a").headers
    context = SpanContext(
        TRACE_ID,
        SPAN_ID,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "v1")]),
    )
    with trace.use_span(NonRecordingSpan(context)):
        headers = builder.build(opened, key="a").headers
        given = builder.build(
            opened, key="a", headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
        ).headers
    assert headers["traceparent"] == f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"
    assert headers["tracestate"] == "vendor=v1"
    assert given["traceparent"] == "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


def test_a_failure_names_topic_and_message_id_and_never_the_payload() -> None:
    failures = [
        FailedDelivery("accounts", f"m-{i}", "Broker: Message size too large", True)
        for i in range(7)
    ]
    error = PublishFailed(failures)
    text = str(error)
    assert text.startswith("7 event(s) not delivered: accounts message-id m-0: Broker: Message")
    assert "m-4" in text
    assert "m-5" not in text
    assert text.endswith("and 2 more")
    assert error.permanent
    assert error.failures == failures


def test_an_unknown_partitioner_is_refused_before_any_client_is_made() -> None:
    with pytest.raises(ValueError, match="unknown partitioner 'fnv1a'"):
        EventPublisher({"bootstrap.servers": "127.0.0.1:1"}, partitioner="fnv1a")
