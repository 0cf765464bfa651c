"""Decoding judges each raw record once: an event, a fired deadline, or a rejection and why."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal

import pytest

from processor._authoring.messages import Message, MessageMetadata, MessageRegistry, message_type
from processor._engine.decode import Event, FiredDeadline, Reason, Rejected, decode, id_problem
from processor._engine.records import Record
from processor._wire import DEADLINE_FIRED

REG = MessageRegistry()
D1 = "00000000-0000-4000-8000-000000000001"  # deadline ids are uuids
LIMIT = 10_000


@message_type("unit.decode.Paid", registry=REG)
class Paid(Message):
    order_id: str
    amount: Decimal
    card_number: str = ""


@message_type("unit.decode.Paid", version=2, registry=REG)
class PaidV2(Message):
    order_id: str
    cents: int


def _record(
    value: bytes | None,
    *,
    key: bytes | None = b"o-1",
    headers: dict[str, str] | None = None,
    extra: tuple[tuple[str, bytes], ...] = (),
) -> Record:
    base = {"message-id": "m-1", "message-type": "unit.decode.Paid", "schema-version": "1"}
    merged = base if headers is None else headers
    pairs = tuple((k, v.encode()) for k, v in merged.items()) + extra
    return Record("in", 2, 41, key, value, pairs, timestamp_ms=1)


def _rejected(record: Record, limit: int = LIMIT) -> Rejected:
    out = decode(record, REG, limit)
    assert isinstance(out, Rejected), out
    return out


def test_a_valid_event_is_decoded_with_its_metadata() -> None:
    headers = {
        "message-id": "m-9",
        "message-type": "unit.decode.Paid",
        "schema-version": "1",
        "correlation-id": "c-1",
        "causation-id": "x-1",
        "occurred-at": "2026-01-02T03:04:05+00:00",
    }
    out = decode(_record(b'{"order_id":"o-1","amount":"2.50"}', headers=headers), REG, LIMIT)
    assert isinstance(out, Event)
    assert out.message == Paid(order_id="o-1", amount=Decimal("2.50"))
    meta = out.metadata
    assert (meta.message_id, meta.correlation_id, meta.causation_id) == ("m-9", "c-1", "x-1")
    assert meta.occurred_at is not None
    assert meta.occurred_at.year == 2026
    assert (meta.topic, meta.partition, meta.offset, meta.key) == ("in", 2, 41, "o-1")


def test_decoded_metadata_equals_one_built_by_its_constructor() -> None:
    # decode fills a MessageMetadata without its __init__ (a hot path): no field may be missed,
    # and the result must stay frozen to the handlers that receive it.
    out = decode(_record(b'{"order_id":"o-1","amount":"2.50"}'), REG, LIMIT)
    assert isinstance(out, Event)
    meta = out.metadata
    built = MessageMetadata(**{f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)})
    assert meta == built
    assert vars(meta).keys() == vars(built).keys()
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.message_id = "other"  # type: ignore[misc]


def test_schema_version_header_selects_the_class() -> None:
    headers = {"message-id": "m", "message-type": "unit.decode.Paid", "schema-version": "2"}
    out = decode(_record(b'{"order_id":"o","cents":5}', headers=headers), REG, LIMIT)
    assert isinstance(out, Event)
    assert out.message == PaidV2(order_id="o", cents=5)


def test_without_a_schema_version_the_latest_version_is_used() -> None:
    headers = {"message-id": "m", "message-type": "unit.decode.Paid"}
    out = decode(_record(b'{"order_id":"o","cents":5}', headers=headers), REG, LIMIT)
    assert isinstance(out, Event)
    assert isinstance(out.message, PaidV2)


def test_a_repeated_header_takes_its_last_value() -> None:
    record = _record(b'{"order_id":"o","amount":"1"}', extra=(("message-id", b"m-last"),))
    out = decode(record, REG, LIMIT)
    assert isinstance(out, Event)
    assert out.metadata.message_id == "m-last"


def test_an_unreadable_occurred_at_is_dropped_not_fatal() -> None:
    headers = {
        "message-id": "m",
        "message-type": "unit.decode.Paid",
        "schema-version": "1",
        "occurred-at": "yesterday",
    }
    out = decode(_record(b'{"order_id":"o","amount":"1"}', headers=headers), REG, LIMIT)
    assert isinstance(out, Event)
    assert out.metadata.occurred_at is None


@pytest.mark.parametrize(
    ("value", "headers", "reason"),
    [
        (b"\xff\xfe not json", None, Reason.UNPARSEABLE),
        (b'{"order_id": "o", ', None, Reason.UNPARSEABLE),
        (None, None, Reason.UNPARSEABLE),
        (b"", None, Reason.UNPARSEABLE),
        (b"{}", {"message-id": "m"}, Reason.UNKNOWN_TYPE),
        (b"{}", {"message-id": "m", "message-type": "unit.decode.Nope"}, Reason.UNKNOWN_TYPE),
        (
            b"{}",
            # Older than every registered version, with no upcaster (a newer one is parked).
            {"message-id": "m", "message-type": "unit.decode.Paid", "schema-version": "0"},
            Reason.UNKNOWN_TYPE,
        ),
        (
            b'{"order_id":"o","amount":"1"}',
            {"message-type": "unit.decode.Paid"},
            Reason.MISSING_MESSAGE_ID,
        ),
        (
            b'{"order_id":"o","amount":"1"}',
            {"message-id": "", "message-type": "unit.decode.Paid"},
            Reason.MISSING_MESSAGE_ID,
        ),
        (b'{"order_id":"o"}', None, Reason.SCHEMA_VIOLATION),
        (b'{"order_id":"o","amount":"1","surprise":1}', None, Reason.SCHEMA_VIOLATION),
        (b'["a list"]', None, Reason.SCHEMA_VIOLATION),
    ],
    ids=[
        "binary",
        "truncated-json",
        "no-value",
        "empty-value",
        "no-type-header",
        "unregistered-type",
        "unregistered-version",
        "no-message-id",
        "empty-message-id",
        "missing-field",
        "unknown-field",
        "wrong-shape",
    ],
)
def test_bad_records_are_rejected_with_their_reason(
    value: bytes | None, headers: dict[str, str] | None, reason: Reason
) -> None:
    out = _rejected(_record(value, headers=headers))
    assert out.reason is reason
    assert out.detail
    assert out.record.offset == 41


def test_size_limit_counts_key_and_value() -> None:
    value = b'{"order_id":"o","amount":"1"}'
    assert isinstance(decode(_record(value, key=b""), REG, len(value)), Event)
    out = _rejected(_record(value, key=b"k"), limit=len(value))
    assert out.reason is Reason.OVERSIZED
    assert str(len(value) + 1) in out.detail


def test_oversize_is_judged_before_anything_else() -> None:
    # Even a record that would be unparseable is rejected as oversized, without reading it.
    out = _rejected(_record(b"x" * 100, headers={}), limit=50)
    assert out.reason is Reason.OVERSIZED


def test_schema_violation_detail_does_not_echo_the_input() -> None:
    secret = "4111-1111-1111-1111"
    value = json.dumps({"order_id": "o", "amount": "lots", "card_number": secret}).encode()
    out = _rejected(_record(value))
    assert out.reason is Reason.SCHEMA_VIOLATION
    assert "amount" in out.detail
    assert secret not in out.detail
    assert "lots" not in out.detail


def _fired(body: object) -> Record:
    value = json.dumps(body).encode()
    return Record("in", 0, 7, b"o-1", value, (("message-type", DEADLINE_FIRED.encode()),))


def test_a_deadline_fired_record_is_decoded() -> None:
    body = {"saga_type": "s", "saga_id": "o-1", "deadline_id": D1, "name": "n", "token": 3}
    out = decode(_fired(body), REG, LIMIT)
    assert out == FiredDeadline(_fired(body), "s", "o-1", D1, "n", 3)


@pytest.mark.parametrize(
    "body",
    [
        {"saga_type": "s", "saga_id": "o-1", "deadline_id": D1, "name": "n"},
        {"saga_type": "s", "saga_id": "o-1", "deadline_id": D1, "name": "n", "token": "x"},
        ["not", "an", "object"],
    ],
    ids=["no-token", "bad-token", "not-an-object"],
)
def test_a_malformed_deadline_fired_record_is_rejected(body: object) -> None:
    out = _rejected(_fired(body))
    assert out.reason is Reason.SCHEMA_VIOLATION


def test_a_deadline_fired_record_that_is_not_json_is_rejected() -> None:
    record = Record("in", 0, 7, None, b"\x00", (("message-type", DEADLINE_FIRED.encode()),))
    assert _rejected(record).reason is Reason.SCHEMA_VIOLATION


# -- text the store cannot hold ---------------------------------------------------------------

GOOD = b'{"order_id":"o-1","amount":"2.50"}'


@pytest.mark.parametrize(
    ("record", "reason", "detail"),
    [
        (_record(GOOD, key=b"o\x00"), "invalid-id", "the record key holds a NUL character"),
        (_record(GOOD, key=b"\xff\xfe"), "invalid-id", "the record key is not valid UTF-8"),
        (_record(GOOD, key=b"k" * 513), "invalid-id", "the record key is over 512 bytes"),
        (
            _record(GOOD, headers={"message-id": "m\x00", "message-type": "unit.decode.Paid"}),
            "invalid-header",
            "header 'message-id' holds a NUL character",
        ),
        (
            _record(GOOD, headers={"message-id": "m" * 513, "message-type": "unit.decode.Paid"}),
            "invalid-id",
            "the message-id is over 512 bytes",
        ),
        (
            _record(GOOD, extra=(("trace", b"\xc3\x28"),)),
            "invalid-header",
            "header 'trace' is not valid UTF-8",
        ),
        (
            _record(GOOD, extra=(("trace", b"x" * 8193),)),
            "invalid-header",
            "header 'trace' is over 8192 bytes",
        ),
        (
            _record(GOOD, extra=(("tr\x00ce", b"x"),)),
            "invalid-header",
            "a header name holds a NUL character",
        ),
        (
            # Over the limit in bytes though not in characters (3 bytes each).
            _record(GOOD, extra=(("trace", "\u20ac".encode() * 2731),)),
            "invalid-header",
            "header 'trace' is over 8192 bytes",
        ),
        (
            # An earlier copy of a repeated header counts too, though the last one wins.
            _record(GOOD, extra=(("trace", b"a\x00"), ("trace", b"b"))),
            "invalid-header",
            "header 'trace' holds a NUL character",
        ),
        (
            _record(b'{"order_id":"o-1\\u0000","amount":"2.50"}'),
            "invalid-text",
            "the value holds a NUL character",
        ),
        (
            _record(b'{"order_id":"\\\\\\u0000","amount":"2.50"}'),
            "invalid-text",
            "the value holds a NUL character",
        ),
        (
            _record(b'{"order_id":"o\x00","amount":"2"}'),
            "invalid-text",
            "the value holds a NUL character",
        ),
    ],
)
def test_text_the_store_cannot_hold_is_rejected_with_its_reason(
    record: Record, reason: str, detail: str
) -> None:
    out = _rejected(record)
    assert (out.reason, out.detail) == (reason, detail)


def test_long_and_multibyte_headers_within_the_limit_are_kept() -> None:
    euro = "\u20ac" * 2730  # 8190 bytes
    extra = (("a", b"x" * 8192), ("b", euro.encode()), ("c", b"y" * 3000))
    out = decode(_record(GOOD, extra=extra), REG, LIMIT)
    assert isinstance(out, Event)
    headers = out.metadata.headers
    assert (headers["a"], headers["b"], headers["c"]) == ("x" * 8192, euro, "y" * 3000)


def test_an_escaped_backslash_before_u0000_is_no_nul() -> None:
    out = decode(_record(b'{"order_id":"\\\\u0000","amount":"1"}'), REG, LIMIT)
    assert isinstance(out, Event)
    assert out.message.order_id == "\\u0000"  # type: ignore[attr-defined]


def test_a_fired_record_with_an_unstorable_saga_id_or_a_non_uuid_id_is_rejected() -> None:
    base = {"saga_type": "s", "saga_id": "o-1", "deadline_id": D1, "name": "n", "token": 3}
    assert _rejected(_fired({**base, "saga_id": "o\x00"})).reason == "invalid-id"
    assert _rejected(_fired({**base, "name": "n" * 600})).reason == "invalid-id"
    assert _rejected(_fired({**base, "deadline_id": "not-a-uuid"})).detail == (
        "the deadline id is not a uuid"
    )


def test_id_problem_names_the_fault_without_the_value() -> None:
    assert id_problem("order-1") is None
    assert id_problem("é" * 256) is None  # 512 bytes
    assert id_problem("é" * 257) == "is over 512 bytes"
    assert id_problem("\ud800") == "is not valid UTF-8"
    assert id_problem("a\x00") == "holds a NUL character"
