"""The registry wire formats without a registry: schemas from models, framing both ways.

The schemas a registry would hand back are the ones generated here, so each case is a round
trip: a value framed as a command would be is read back as a consumed record would be.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from decimal import Decimal

import fastavro
import pytest
from pydantic import Field

from processor import Message, MessageRegistry
from processor._engine.decode import Event, Reason, Rejected, decode
from processor._engine.records import OutboxRow, Record
from processor._schemas.codec import (
    HEADER_SCHEMA_ID,
    RegisteredSchema,
    Rejection,
    Wire,
    writer_schema,
)
from processor._schemas.formats import (
    SubjectNaming,
    TopicFormat,
    WireFormat,
    frame_header,
    read_frame,
    subject,
)
from processor._schemas.generate import UnsupportedField, avro_schema, proto_file
from processor._wire import envelope

REG = MessageRegistry()


class Leg(Message):
    city: str
    nights: int = 1


class Booked(Message):
    trip_id: str
    amount: Decimal
    at: datetime
    note: str | None = None
    legs: list[Leg] = Field(default_factory=list)
    first: Leg | None = None
    tags: list[str] = Field(default_factory=list)
    rate: float = 1.5
    vip: bool = False


REG.register(Booked, "trips.Booked", topic="trips")


class Mapped(Message):
    counts: dict[str, int]


REG.register(Mapped, "trips.Mapped")

VALUE = Booked(
    trip_id="t-1",
    amount=Decimal("12.50"),
    at=datetime(2026, 12, 5, 10, 0, tzinfo=UTC),
    legs=[Leg(city="Oslo", nights=2), Leg(city="Rome")],
    first=Leg(city="Oslo"),
    tags=["a", "b"],
)

KINDS = {WireFormat.JSON_SCHEMA: "JSON", WireFormat.AVRO: "AVRO", WireFormat.PROTOBUF: "PROTOBUF"}


def _row(topic: str, message: Message, name: str = "trips.Booked") -> OutboxRow:
    headers = envelope(message_id="m-1", message_type=name, schema_version=1)
    return OutboxRow("trip", "t-1", topic, b"t-1", headers, message.model_dump_json().encode())


def _round_trip(fmt: WireFormat, *, headers: bool) -> Record | Rejection | None:
    wire = Wire({"trips": TopicFormat(fmt)}, REG)
    row = _row("trips", VALUE)
    assert wire.unregistered([row]) == [("trips", "trips.Booked", "1")]
    wire.learn_writer(("trips", "trips.Booked", "1"), 7)
    assert wire.unregistered([row]) == []
    value = wire.frame(row)
    frame = read_frame(value)
    assert frame is not None
    assert frame[0] == 7
    kept = tuple((k, v.encode()) for k, v in row.headers.items()) if headers else ()
    record = Record("trips", 0, 41, b"t-1", value, kept)
    assert wire.unknown_ids([record]) == {7}
    text = writer_schema(REG.by_name("trips.Booked"), "trips", fmt, SubjectNaming.TOPIC).text
    wire.learn(7, RegisteredSchema(KINDS[fmt], text))
    assert wire.unknown_ids([record]) == set()
    return wire.unframe(record)


@pytest.mark.parametrize("fmt", list(KINDS))
def test_a_framed_value_reads_back_as_the_same_message(fmt: WireFormat) -> None:
    out = _round_trip(fmt, headers=True)
    assert isinstance(out, Record)
    assert Booked.model_validate_json(out.value or b"") == VALUE
    assert out.header(HEADER_SCHEMA_ID) == "7"
    decoded = decode(out, REG, 1 << 20)
    assert isinstance(decoded, Event)
    assert decoded.message == VALUE
    assert decoded.metadata.message_id == "m-1"


@pytest.mark.parametrize("fmt", list(KINDS))
def test_a_record_without_our_headers_gets_its_type_from_the_schema_and_id_from_its_place(
    fmt: WireFormat,
) -> None:
    out = _round_trip(fmt, headers=False)
    assert isinstance(out, Record)
    assert out.header("message-type") == "trips.Booked"
    assert out.header("message-id") == "trips-0-41"
    decoded = decode(out, REG, 1 << 20)
    assert isinstance(decoded, Event)
    assert decoded.message == VALUE


def test_the_id_comes_from_the_configured_field() -> None:
    wire = Wire({"trips": TopicFormat(WireFormat.JSON_SCHEMA, id_field="trip_id")}, REG)
    wire.learn(3, RegisteredSchema("JSON", json.dumps({"title": "Booked"})))
    record = Record("trips", 0, 1, None, frame_header(3) + VALUE.model_dump_json().encode(), ())
    out = wire.unframe(record)
    assert isinstance(out, Record)
    assert out.header("message-id") == "t-1"
    assert out.header("message-type") == "trips.Booked"


def test_decode_rejects_what_cannot_be_read_with_the_record_as_it_came() -> None:
    wire = Wire({"trips": TopicFormat(WireFormat.AVRO)}, REG)
    wire.learn(5, None)
    wire.learn(6, RegisteredSchema("AVRO", json.dumps(avro_schema(REG.by_name("trips.Booked")))))
    wire.learn(8, RegisteredSchema("JSON", json.dumps({"title": "x"})))
    cases = {
        frame_header(5) + b"\x02": (Reason.UNKNOWN_SCHEMA, "schema id 5 is not in the registry"),
        frame_header(6) + b"\xff\xff": (Reason.UNPARSEABLE, "does not decode with schema id 6"),
        frame_header(8) + b"{}": (Reason.UNPARSEABLE, "is json-schema, the topic is set to avro"),
        b"\x00\x01": (Reason.UNPARSEABLE, "shorter than a registry frame"),
    }
    for value, (reason, detail) in cases.items():
        record = Record("trips", 0, 1, None, value, ())
        out = decode(record, REG, 1 << 20, wire)
        assert isinstance(out, Rejected), value
        assert out.reason is reason
        assert detail in out.detail
        assert out.record is record


def test_an_unknown_record_name_is_an_unknown_type() -> None:
    wire = Wire({"trips": TopicFormat(WireFormat.JSON_SCHEMA)}, REG)
    wire.learn(9, RegisteredSchema("JSON", json.dumps({"title": "shop.Other"})))
    out = decode(Record("trips", 0, 1, None, frame_header(9) + b"{}", ()), REG, 1 << 20, wire)
    assert isinstance(out, Rejected)
    assert out.reason is Reason.UNKNOWN_TYPE
    assert "'shop.Other'" in out.detail


def test_our_json_on_a_framed_topic_and_every_other_topic_pass_untouched() -> None:
    wire = Wire({"trips": TopicFormat(WireFormat.AVRO)}, REG)
    plain = Record("trips", 0, 1, None, b'{"a":1}', ())
    assert wire.unframe(plain) is None
    assert wire.unframe(Record("other", 0, 1, None, frame_header(1) + b"x", ())) is None
    row = _row("other", VALUE)
    assert wire.frame(row) is row.value
    fired = OutboxRow(None, None, "trips", None, {"message-type": "saga.deadline-fired"}, b"{}")
    assert wire.unregistered([fired]) == []
    assert wire.frame(fired) == b"{}"


def test_avro_schema_has_defaults_for_every_optional_field() -> None:
    schema = avro_schema(REG.by_name("trips.Booked"))
    assert schema["name"] == "Booked"
    assert schema["namespace"] == "trips"
    fields = {f["name"]: f for f in schema["fields"]}
    assert fields["note"] == {"name": "note", "type": ["null", "string"], "default": None}
    assert fields["rate"]["default"] == 1.5
    assert fields["tags"]["default"] == []
    assert "default" not in fields["trip_id"]
    fastavro.parse_schema(schema)  # valid Avro
    out = io.BytesIO()
    fastavro.schemaless_writer(
        out, fastavro.parse_schema(schema), json.loads(VALUE.model_dump_json())
    )


def test_protobuf_numbers_follow_the_field_order_and_optionals_have_presence() -> None:
    fdp = proto_file(REG.by_name("trips.Booked"))
    booked = fdp.message_type[0]
    assert booked.name == "Booked"
    assert fdp.package == "trips"
    assert [(f.name, f.number) for f in booked.field][:3] == [
        ("trip_id", 1),
        ("amount", 2),
        ("at", 3),
    ]
    assert {f.name for f in booked.field if f.proto3_optional} == {"note", "first"}
    assert [m.name for m in fdp.message_type] == ["Booked", "Leg"]


def test_a_field_a_format_cannot_express_is_named() -> None:
    with pytest.raises(UnsupportedField, match=r"trips.Mapped.counts"):
        proto_file(REG.by_name("trips.Mapped"))


def test_subjects_follow_the_naming_strategy() -> None:
    assert subject(SubjectNaming.TOPIC, "trips", "trips.Booked") == "trips-value"
    assert subject(SubjectNaming.RECORD, "trips", "trips.Booked") == "trips.Booked"
    assert subject(SubjectNaming.TOPIC_RECORD, "trips", "trips.Booked") == "trips-trips.Booked"


def test_fields_the_model_does_not_know_yet_are_left_out() -> None:
    # A producer may add a field (the registry checks that this is compatible) before the
    # processor's models know it: the rest of the value still reads.
    wire = Wire({"trips": TopicFormat(WireFormat.JSON_SCHEMA)}, REG)
    wire.learn(4, RegisteredSchema("JSON", json.dumps({"title": "trips.Booked"})))
    body = {**json.loads(VALUE.model_dump_json()), "added_later": 3}
    record = Record("trips", 0, 1, None, frame_header(4) + json.dumps(body).encode(), ())
    out = decode(record, REG, 1 << 20, wire)
    assert isinstance(out, Event)
    assert out.message == VALUE


def test_settings_read_a_bare_format_and_want_a_registry_for_a_framed_topic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from processor._errors import ConfigurationError
    from processor.settings import load_settings

    topics = {"orders": "avro", "pay": {"format": "protobuf", "id_field": "pay_id"}, "x": "json"}
    monkeypatch.setenv("SAGA_DATABASE__URL", "postgresql://u@h/d")
    monkeypatch.setenv("SAGA_SCHEMA_REGISTRY__URL", "http://127.0.0.1:1/apis/ccompat/v7")
    monkeypatch.setenv("SAGA_SCHEMA_REGISTRY__TOPICS", json.dumps(topics))
    monkeypatch.setenv("SAGA_SCHEMA_REGISTRY__CONFIG", '{"basic.auth.user.info": "me:secret"}')
    sr = load_settings().schema_registry
    assert sr.formats("stage.") == {
        "stage.orders": TopicFormat(WireFormat.AVRO),
        "stage.pay": TopicFormat(WireFormat.PROTOBUF, "pay_id"),
    }
    assert sr.subject_naming is SubjectNaming.TOPIC_RECORD
    assert sr.auto_register
    assert "secret" not in repr(sr)
    assert sr.client_config()["basic.auth.user.info"] == "me:secret"
    monkeypatch.delenv("SAGA_SCHEMA_REGISTRY__URL")
    with pytest.raises(ConfigurationError, match="set SAGA_SCHEMA_REGISTRY__URL"):
        load_settings()
    monkeypatch.setenv("SAGA_SCHEMA_REGISTRY__TOPICS", '{"orders": "xml"}')
    with pytest.raises(ConfigurationError, match="SAGA_SCHEMA_REGISTRY__TOPICS"):
        load_settings()
