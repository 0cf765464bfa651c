"""The resolver and the framing producer over an in-memory registry (the contract suite checks
that it answers as the real one does): fetched once, waited on while away, refused loudly."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from processor import Message, MessageRegistry
from processor._engine.records import OutboxRow, Record
from processor._errors import Retryable, SendFailure
from processor._memory.registry import MemoryRegistry
from processor._runtime.schemas import MAX_BACKOFF, FramingProducer, SchemaResolver
from processor._schemas.codec import Wire, writer_schema
from processor._schemas.formats import (
    SubjectNaming,
    TopicFormat,
    WireFormat,
    frame_header,
    read_frame,
)
from processor._wire import envelope

REG = MessageRegistry()


class Paid(Message):
    order_id: str
    cents: int


REG.register(Paid, "shop.Paid", topic="payments")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _resolver(
    registry: MemoryRegistry, fmt: WireFormat = WireFormat.AVRO, *, auto_register: bool = True
) -> tuple[SchemaResolver, Clock]:
    clock = Clock()
    wire = Wire({"payments": TopicFormat(fmt)}, REG)
    made = SchemaResolver(
        wire, registry, auto_register=auto_register, clock=clock, sleep=clock.sleep
    )
    return made, clock


def _row(value: bytes | None = None) -> OutboxRow:
    headers = envelope(message_id="m-1", message_type="shop.Paid", schema_version=1)
    body = value if value is not None else Paid(order_id="o-1", cents=5).model_dump_json().encode()
    return OutboxRow("s", "o-1", "payments", b"o-1", headers, body)


def _framed(schema_id: int) -> Record:
    return Record("payments", 0, 7, b"o-1", frame_header(schema_id) + b"{}", ())


def test_each_schema_id_is_fetched_once_and_an_unknown_one_is_learnt_as_unknown() -> None:
    registry = MemoryRegistry()
    resolver, _ = _resolver(registry)
    resolver.prepare_out([_row()])  # registers the schema: id 1
    resolver.prepare_in([_framed(1), _framed(1), _framed(99)])
    calls = registry.calls
    resolver.prepare_in([_framed(1), _framed(99)])
    assert registry.calls == calls
    assert resolver.wire.unframe(_framed(99)).reason == "unknown-schema"  # type: ignore[union-attr]


def test_a_registry_away_is_waited_on_with_a_growing_pause_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = MemoryRegistry()
    resolver, clock = _resolver(registry)
    registry.down = True
    with caplog.at_level(logging.INFO, logger="processor._runtime.schemas"):
        for _ in range(6):
            with pytest.raises(Retryable, match="unreachable"):
                resolver.prepare_in([_framed(1)])
        waits = list(clock.slept)
        registry.down = False
        resolver.prepare_in([_framed(1)])
    # The first try is at once; each later one waits longer, up to the bound.
    assert waits == sorted(waits)
    assert waits[0] > 0
    assert waits[-1] == MAX_BACKOFF
    assert resolver.failures == 6
    assert resolver.down_for == 0.0
    said = [r.getMessage() for r in caplog.records]
    assert sum("waiting for the schema registry" in m for m in said) == 1
    assert any("answers again" in m for m in said)


def test_nothing_is_asked_of_the_registry_for_our_json_or_known_ids() -> None:
    registry = MemoryRegistry()
    registry.down = True
    resolver, _ = _resolver(registry)
    plain = Record("payments", 0, 1, None, b'{"order_id": "o"}', ())
    other = Record("elsewhere", 0, 1, None, frame_header(5) + b"x", ())
    resolver.prepare_in([plain, other])
    assert registry.calls == 0


def test_a_schema_not_registered_waits_when_registration_is_off() -> None:
    registry = MemoryRegistry()
    resolver, _ = _resolver(registry, auto_register=False)
    with pytest.raises(Retryable, match="run `saga-processor schemas register`"):
        resolver.prepare_out([_row()])
    mtype = REG.by_name("shop.Paid")
    registry.register(writer_schema(mtype, "payments", WireFormat.AVRO, SubjectNaming.TOPIC_RECORD))
    resolver, _ = _resolver(registry, auto_register=False)
    resolver.prepare_out([_row()])


def test_a_refused_schema_keeps_the_rows_and_says_why() -> None:
    registry = MemoryRegistry(compatible=lambda _old, _new: False)
    mtype = REG.by_name("shop.Paid")
    registry.register(
        writer_schema(mtype, "payments", WireFormat.JSON_SCHEMA, SubjectNaming.TOPIC_RECORD)
    )
    # Another format's schema under the same subject: the subject's rule refuses it.
    resolver, _ = _resolver(registry, WireFormat.AVRO)
    with pytest.raises(Retryable, match=r"refused the schema of subject payments-shop\.Paid"):
        resolver.prepare_out([_row()])


class Sent:
    """Records what reaches the broker; fails the records it is told to."""

    def __init__(self, refuse: Sequence[int] = ()) -> None:
        self.rows: list[OutboxRow] = []
        self.refuse = set(refuse)

    def send(self, records: Sequence[OutboxRow], timeout: float) -> list[SendFailure]:
        self.rows = list(records)
        return [SendFailure(i, "too large", True) for i in range(len(records)) if i in self.refuse]

    def close(self, timeout: float) -> None:
        pass


def test_the_framing_producer_frames_fails_the_unfit_alone_and_keeps_positions() -> None:
    registry = MemoryRegistry()
    resolver, _ = _resolver(registry)
    inner = Sent(refuse=[2])  # the third record that reaches the broker: the fourth row
    producer = FramingProducer(inner, resolver)
    unfit = _row(b'{"order_id": 3}')  # not a string: Avro refuses it
    fired = OutboxRow(None, None, "payments", None, {"message-type": "saga.deadline-fired"}, b"{}")
    failures = producer.send([_row(), unfit, fired, _row()], 5.0)
    assert [(f.index, f.permanent) for f in failures] == [(1, True), (3, True)]
    assert "does not fit its schema" in failures[0].reason
    assert failures[1].reason == "too large"  # the broker's, at the row's own position
    assert [read_frame(r.value) is not None for r in inner.rows] == [True, False, True]


def test_the_framing_producer_keeps_every_row_while_the_registry_is_away() -> None:
    registry = MemoryRegistry()
    registry.down = True
    resolver, _ = _resolver(registry)
    inner = Sent()
    with pytest.raises(Retryable):
        FramingProducer(inner, resolver).send([_row()], 5.0)
    assert inner.rows == []
