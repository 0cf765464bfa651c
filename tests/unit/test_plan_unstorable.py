"""A state that cannot be stored as JSON parks its saga; the rest of the batch goes on.

A handler can leave values that pass its model's validation but that no JSON encoder takes: a
``bytes`` field holding bytes that are not UTF-8, a string with a lone surrogate. Stored, they
stopped the whole batch on every replica in turn; now that saga is parked at its first record of
the batch, with the state it had before, and nothing it did in the batch is written. (Only the
state a batch leaves is stored: a bad value that a later record of the batch replaces is no harm.)
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from processor import Message, SagaCommands, SagaState, message_type, saga, saga_event_handler
from processor._authoring.messages import MessageRegistry
from processor._engine.decode import decode
from processor._engine.plan import Planner
from processor._engine.records import Record
from processor._engine.rows import ACTIVE, PARKED, Loaded, SagaRow, WriteSet
from processor._invocation import bind_all

REG = MessageRegistry()
NOW = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
SAGA = "unit-blob"


@message_type("unit.blob.Put", registry=REG)
class Put(Message):
    blob_id: str
    text: str = ""
    raw: str = ""  # hex of the bytes to store


@message_type("unit.blob.Stored", registry=REG, topic="stored")
class Stored(Message):
    blob_id: str


@saga(type=SAGA)
class BlobSaga(SagaState):
    blob_id: str = ""
    text: str = ""
    data: bytes = b""

    @saga_event_handler(Put, association_property="blob_id", start=True)
    def put(self, event: Put, commands: SagaCommands) -> None:
        self.blob_id = event.blob_id
        self.text = event.text.replace("SURROGATE", "\udc80")
        self.data = bytes.fromhex(event.raw)
        commands.send(Stored(blob_id=event.blob_id))


def _record(offset: int, message: Put) -> Record:
    headers = (
        ("message-id", f"m-{offset}".encode()),
        ("message-type", b"unit.blob.Put"),
        ("schema-version", b"1"),
    )
    return Record(
        "in", 0, offset, message.blob_id.encode(), message.model_dump_json().encode(), headers
    )


def _plan(records: list[Record], *rows: SagaRow) -> WriteSet:
    planner = Planner(bind_all([BlobSaga], registry=REG), registry=REG, dead_letter_topic="dl")
    items, _ = planner.route(decode(r, REG, 1 << 20) for r in records)
    loaded = Loaded({(r.saga_type, r.saga_id): r for r in rows}, set(), {}, None, NOW)
    return planner.plan(items, loaded, NOW)


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (Put(blob_id="b", raw="ff"), "a bytes value is not valid UTF-8"),
        (Put(blob_id="b", text="SURROGATE"), "a string holds a lone surrogate (not valid Unicode)"),
    ],
)
def test_a_saga_whose_state_cannot_be_stored_is_parked_and_the_batch_goes_on(
    bad: Put, problem: str
) -> None:
    stored = SagaRow(SAGA, "b", {"blob_id": "b", "text": "before", "data": ""}, ACTIVE, 3)
    ws = _plan(
        [
            _record(1, Put(blob_id="a", text="fine")),
            _record(2, bad),
            _record(3, bad),
            _record(4, Put(blob_id="c", raw="6869")),
        ],
        stored,
    )
    rows = {w.saga_id: w for w in ws.sagas}
    assert (rows["a"].status, rows["a"].state) == (
        ACTIVE,
        {"blob_id": "a", "text": "fine", "data": ""},
    )
    assert (rows["c"].status, rows["c"].state) == (
        ACTIVE,
        {"blob_id": "c", "text": "", "data": "hi"},
    )
    # Parked at its first record of the batch (each parked record is a version), the state as
    # it was; the next record waits behind.
    b = rows["b"]
    assert (b.status, b.state, b.version) == (PARKED, stored.state, 5)
    assert b.parked_reason == f"state cannot be stored as JSON: {problem}"
    assert [(p.record.offset, p.reason) for p in ws.parked] == [
        (2, b.parked_reason),
        (3, "behind a parked saga"),
    ]
    # Nothing the failed handler did is written: only a's and c's commands leave.
    assert [o.key for o in ws.outbox] == [b"a", b"c"]
    assert [(h.saga_id, h.outcome) for h in ws.history] == [
        ("a", "applied"),
        ("b", "parked"),
        ("b", "parked-behind"),
        ("c", "applied"),
    ]


def test_a_new_saga_whose_first_state_cannot_be_stored_is_parked_without_state() -> None:
    ws = _plan([_record(1, Put(blob_id="n", raw="c3"))])
    [row] = ws.sagas
    assert (row.saga_id, row.status, row.state) == ("n", PARKED, None)
    assert not ws.outbox
