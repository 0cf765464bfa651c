"""wire.envelope: the one place message headers are built, and the producers that use it."""

from __future__ import annotations

import ast
import dataclasses
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from processor import _wire as wire
from processor._authoring.messages import Message, MessageMetadata, MessageRegistry, message_type
from processor._authoring.participant.handles import reply_row
from processor._engine.records import Record
from processor._wire import FiredRecord, OperatorAction, OperatorRecord, envelope
from processor.publish import EventRecordBuilder
from processor.testing._engine import event_record

PROCESSOR = Path(__file__).resolve().parents[2] / "processor"

REG = MessageRegistry()

AT = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@message_type("unit.wire.Opened", version=2, topic="accounts", registry=REG)
class Opened(Message):
    account_id: str


def test_every_header_in_the_standard_order() -> None:
    headers = envelope(
        message_id="m-1",
        message_type="t",
        schema_version=2,
        correlation_id="c-1",
        causation_id="x-1",
        occurred_at=AT,
        saga_type="s",
        saga_id="s-1",
        traceparent=TRACE,
        tracestate="k=v",
        deadline_unix_ms=1700,
        extra={"tenant": "t-9"},
    )
    assert list(headers.items()) == [
        ("traceparent", TRACE),
        ("tracestate", "k=v"),
        ("tenant", "t-9"),
        ("message-id", "m-1"),
        ("message-type", "t"),
        ("schema-version", "2"),
        ("correlation-id", "c-1"),
        ("causation-id", "x-1"),
        ("occurred-at", "2026-03-04T05:06:07+00:00"),
        ("saga-type", "s"),
        ("saga-id", "s-1"),
        ("deadline-unix-ms", "1700"),
    ]


def test_a_header_given_none_is_left_out_and_text_times_are_sent_as_is() -> None:
    assert envelope(message_id="m-1", message_type="t", occurred_at="then") == {
        "message-id": "m-1",
        "message-type": "t",
        "occurred-at": "then",
    }


def test_the_standard_headers_win_a_clash_with_extra_and_keep_its_place() -> None:
    headers = envelope(
        message_id="m-1", message_type="t", extra={"message-id": "forged", "traceparent": "mine"}
    )
    assert list(headers.items()) == [
        ("message-id", "m-1"),
        ("traceparent", "mine"),
        ("message-type", "t"),
    ]


def test_a_fired_deadline_carries_the_envelope_then_its_own_headers() -> None:
    fired = FiredRecord("s", "s-1", "d-1", "timeout", 7)
    headers = fired.headers(TRACE, "k=v")
    child = wire.child_traceparent(TRACE, "deadline:d-1:7")
    assert list(headers.items()) == [
        ("traceparent", child),
        ("tracestate", "k=v"),
        ("message-id", "deadline:d-1:7"),
        ("message-type", "saga.deadline-fired"),
        ("saga-type", "s"),
        ("saga-id", "s-1"),
        ("deadline-id", "d-1"),
        ("deadline-name", "timeout"),
        ("fencing-token", "7"),
    ]
    # A broken trace context is dropped rather than forwarded; its state still travels.
    assert "traceparent" not in fired.headers("garbage", "k=v")
    assert fired.headers("garbage", "k=v")["tracestate"] == "k=v"
    assert "tracestate" not in fired.headers(None, "k=v")


def test_an_operator_record_is_signed_after_its_envelope() -> None:
    request = OperatorRecord(
        OperatorAction.CANCEL, "s", "s-1", "c-1", "ada", "why", issued_at=1_777_626_000_000
    )
    headers = request.headers(b"key")
    assert list(headers) == ["message-id", "message-type", "saga-type", "saga-id", "operator-auth"]
    assert headers["message-type"] == "saga.operator-command"
    assert wire.operator_signed(b"key", request.value(), headers["operator-auth"])


def test_an_operator_records_issued_at_is_signed_and_read_back() -> None:
    request = OperatorRecord(
        OperatorAction.CANCEL, "s", "s-1", "c-1", "ada", "why", issued_at=1_777_626_000_000
    )
    assert OperatorRecord.parse(request.value()) == request
    signature = request.headers(b"key")["operator-auth"]
    # Made younger, the value no longer matches its signature.
    younger = dataclasses.replace(request, issued_at=1_777_626_000_000 + 3_600_000)
    assert not wire.operator_signed(b"key", younger.value(), signature)
    # An older release's value has none, and reads back without one.
    legacy = dataclasses.replace(request, issued_at=None)
    assert b"issued_at" not in legacy.value()
    assert OperatorRecord.parse(legacy.value()).issued_at is None


@pytest.mark.parametrize("issued_at", ['"1777626000000"', "1777626000000.5", "true"])
def test_an_issued_at_that_is_not_an_integer_is_malformed(issued_at: str) -> None:
    legacy = OperatorRecord(OperatorAction.CANCEL, "s", "s-1", "c-1", "ada", "why").value()
    value = legacy.replace(b"}", b', "issued_at": ' + issued_at.encode() + b"}")
    with pytest.raises(ValueError, match="issued_at is not an integer"):
        OperatorRecord.parse(value)


def test_a_reply_carries_the_commands_key_conversation_and_trace() -> None:
    command = {
        "message-id": "cmd-1",
        "correlation-id": "conv-1",
        "saga-type": "order",
        "saga-id": "o-1",
        "traceparent": TRACE,
        "tracestate": "not-propagated",
    }
    row = reply_row(
        Opened(account_id="a"), command, b"o-1", registry=REG, topic="t", message_id="r"
    )
    assert list(row.headers) == [
        "traceparent",
        "message-id",
        "message-type",
        "schema-version",
        "correlation-id",
        "causation-id",
        "occurred-at",
        "saga-type",
        "saga-id",
    ]
    assert {k: v for k, v in row.headers.items() if k != "occurred-at"} == {
        "traceparent": TRACE,
        "message-id": "r",
        "message-type": "unit.wire.Opened",
        "schema-version": "2",
        "correlation-id": "conv-1",
        "causation-id": "cmd-1",
        "saga-type": "order",
        "saga-id": "o-1",
    }


def test_a_reply_to_a_command_without_saga_headers_has_none() -> None:
    row = reply_row(Opened(account_id="a"), {"message-id": "cmd-1"}, b"k", registry=REG, topic="t")
    assert "saga-type" not in row.headers
    assert "saga-id" not in row.headers
    assert "traceparent" not in row.headers
    # The conversation starts with the command.
    assert row.headers["correlation-id"] == "cmd-1"


def test_a_published_event_has_the_callers_headers_before_the_standard_ones() -> None:
    row = EventRecordBuilder(registry=REG).build(
        Opened(account_id="a-1"),
        key="a-1",
        message_id="m-1",
        causation_id="x-1",
        occurred_at=AT,
        headers={"traceparent": TRACE, "tenant": "t-9"},
    )
    assert list(row.headers.items()) == [
        ("traceparent", TRACE),
        ("tenant", "t-9"),
        ("message-id", "m-1"),
        ("message-type", "unit.wire.Opened"),
        ("schema-version", "2"),
        ("correlation-id", "m-1"),
        ("causation-id", "x-1"),
        ("occurred-at", "2026-03-04T05:06:07+00:00"),
    ]


def test_the_engine_fixtures_event_record_uses_the_envelope() -> None:
    metadata = MessageMetadata(
        message_id="m-1",
        message_type="unit.wire.Opened",
        correlation_id="c-1",
        causation_id=None,
        occurred_at=AT,
        topic="accounts",
        partition=0,
        offset=0,
        key="a-1",
        headers={"tenant": "t-9"},
    )
    record: Record = event_record(Opened(account_id="a-1"), metadata, REG, 3)
    assert record.headers == (
        ("tenant", b"t-9"),
        ("message-id", b"m-1"),
        ("message-type", b"unit.wire.Opened"),
        ("schema-version", b"2"),
        ("correlation-id", b"c-1"),
        ("occurred-at", b"2026-03-04T05:06:07+00:00"),
    )


# -- header names are spelled in processor/_wire.py only --------------------------------------
HEADER_NAMES = {v for k, v in vars(wire).items() if k.startswith("HEADER_")}
# A JSON path into a stored row's headers in SQL, e.g. headers->>'message-id'.
_ANY_NAME = "|".join(map(re.escape, sorted(HEADER_NAMES)))
_SQL_PATH = re.compile(rf"->>?\s*'({_ANY_NAME})'")
# A migration is history: it must create what it created when written, whatever the constants
# say later.
MIGRATIONS = "_postgres/schema/ddl.py"


def _attribute_names(tree: ast.AST) -> set[int]:
    """The ``attrgetter("traceparent", ...)`` arguments: attribute names, not header names."""
    return {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "attrgetter"
        for arg in node.args
    }


def test_no_header_name_is_spelled_outside_wire() -> None:
    found: list[str] = []
    for path in sorted(PROCESSOR.rglob("*.py")):
        where = path.relative_to(PROCESSOR).as_posix()
        if where in ("_wire.py", MIGRATIONS):
            continue
        tree = ast.parse(path.read_text(), str(path))
        attributes = _attribute_names(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if id(node) in attributes:
                continue
            names = {node.value} & HEADER_NAMES | set(_SQL_PATH.findall(node.value))
            found += [f"{where}:{node.lineno}: {n}" for n in sorted(names)]
    assert found == []
