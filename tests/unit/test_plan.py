"""The pure batch planner over in-memory rows: duplicates, skips, parking and stale deadlines."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import Field

from processor import (
    Message,
    SagaCommands,
    SagaDeadlines,
    SagaState,
    message_type,
    saga,
    saga_deadline_handler,
    saga_event_handler,
)
from processor._authoring.messages import MessageRegistry
from processor._engine.decode import Reason, Rejected, decode
from processor._engine.plan import Item, Planner
from processor._engine.records import Record
from processor._engine.rows import ACTIVE, ENDED, PARKED, DeadlineRef, Loaded, SagaRow, WriteSet
from processor._invocation import bind_all
from processor._wire import DEADLINE_FIRED

REG = MessageRegistry()
D1 = "00000000-0000-4000-8000-000000000001"  # deadline ids are uuids
NOW = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
SAGA = "unit-order"
DEAD = "dl"


@message_type("unit.plan.Opened", registry=REG)
class Opened(Message):
    order_id: str


@message_type("unit.plan.Noted", registry=REG)
class Noted(Message):
    order_id: str
    note: str = ""


@message_type("unit.plan.Closed", registry=REG)
class Closed(Message):
    order_id: str


@message_type("unit.plan.Ship", registry=REG, topic="ship")
class Ship(Message):
    order_id: str
    note: str


class Gate:
    """Makes handlers fail while `failures` is above zero, counting every call."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls = 0

    def check(self) -> None:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise RuntimeError("gate closed")


@saga(type=SAGA)
class OrderSaga(SagaState):
    order_id: str = ""
    notes: list[str] = Field(default_factory=list)

    @saga_event_handler(Opened, association_property="order_id", start=True)
    def opened(self, event: Opened, deadlines: SagaDeadlines, gate: Gate) -> None:
        gate.check()
        self.order_id = event.order_id
        deadlines.schedule("remind", timedelta(minutes=5))

    @saga_event_handler(Noted, association_property="order_id")
    def noted(
        self, event: Noted, commands: SagaCommands, deadlines: SagaDeadlines, gate: Gate
    ) -> None:
        gate.check()
        self.notes.append(event.note)
        if event.note == "cancel":
            deadlines.cancel("remind")
        elif event.note == "reschedule":
            deadlines.schedule("remind", timedelta(minutes=10))
        commands.send(Ship(order_id=self.order_id, note=event.note))

    @saga_event_handler(Closed, association_property="order_id", end=True)
    def closed(self, event: Closed) -> None:
        """Ends the saga."""

    @saga_deadline_handler("remind")
    def remind(self, commands: SagaCommands) -> None:
        commands.send(Ship(order_id=self.order_id, note="reminder"))


def _planner(gate: Gate | None = None, attempts: int = 3) -> Planner:
    sagas = bind_all([OrderSaga], dependencies={Gate: gate or Gate()}, registry=REG)
    return Planner(sagas, registry=REG, dead_letter_topic=DEAD, handler_attempts=attempts)


class Log:
    """Hands out consecutive offsets on one partition, as a topic would."""

    def __init__(self) -> None:
        self.offset = 0

    def event(self, message: Message, message_id: str | None = None) -> Record:
        self.offset += 1
        name = REG.of(type(message)).name
        headers = (
            ("message-id", (message_id or f"m-{self.offset}").encode()),
            ("message-type", name.encode()),
            ("schema-version", b"1"),
        )
        key = getattr(message, "order_id", "").encode()
        value = message.model_dump_json().encode()
        return Record("in", 0, self.offset, key, value, headers)

    def fired(
        self, deadline_id: str, token: int, saga_id: str = "o1", name: str = "remind"
    ) -> Record:
        self.offset += 1
        body = {
            "saga_type": SAGA,
            "saga_id": saga_id,
            "deadline_id": deadline_id,
            "name": name,
            "token": token,
        }
        headers = (("message-type", DEADLINE_FIRED.encode()),)
        return Record("in", 0, self.offset, saga_id.encode(), json.dumps(body).encode(), headers)


def _loaded(
    *rows: SagaRow,
    applied: set[tuple[str, str, str]] | None = None,
    deadlines: dict[str, DeadlineRef] | None = None,
    lease: int | None = None,
) -> Loaded:
    return Loaded(
        sagas={(r.saga_type, r.saga_id): r for r in rows},
        applied=applied or set(),
        deadlines=deadlines or {},
        lease_token=lease,
        now=NOW,
    )


def _active(saga_id: str = "o1", version: int = 1, notes: list[str] | None = None) -> SagaRow:
    state = {"order_id": saga_id, "notes": notes or []}
    return SagaRow(SAGA, saga_id, state, ACTIVE, version)


def _plan(planner: Planner, records: list[Record], loaded: Loaded) -> WriteSet:
    items, _wants = planner.route(decode(r, REG, 1 << 20) for r in records)
    return planner.plan(items, loaded, NOW)


def _outcomes(ws: WriteSet) -> list[tuple[str, str, int | None]]:
    return [(h.saga_id, h.outcome, h.version) for h in ws.history]


def test_route_names_the_rows_to_load() -> None:
    log = Log()
    records = [log.event(Opened(order_id="o1")), log.event(Noted(order_id="o2"), "n-1")]
    records.append(log.fired(D1, 4, saga_id="o3"))
    items, wants = _planner().route(decode(r, REG, 1 << 20) for r in records)
    assert [i.saga_id for i in items if isinstance(i, Item)] == ["o1", "o2", "o3"]
    assert wants.saga_keys == {(SAGA, "o1"), (SAGA, "o2"), (SAGA, "o3")}
    assert wants.message_keys == {(SAGA, "o1", "m-1"), (SAGA, "o2", "n-1")}
    assert wants.deadline_ids == {D1}


def test_a_batch_starts_and_advances_a_saga_with_contiguous_versions() -> None:
    log = Log()
    records = [log.event(Opened(order_id="o1")), log.event(Noted(order_id="o1", note="a"))]
    ws = _plan(_planner(), records, _loaded())
    assert _outcomes(ws) == [("o1", "applied", 1), ("o1", "applied", 2)]
    [write] = ws.sagas
    assert (write.status, write.version, write.expected_version) == (ACTIVE, 2, None)
    assert write.state == {"order_id": "o1", "notes": ["a"]}
    assert [json.loads(o.value)["note"] for o in ws.outbox] == ["a"]
    assert [(d.name, d.due_at) for d in ws.deadline_inserts] == [
        ("remind", NOW + timedelta(minutes=5))
    ]


def test_a_new_sagas_schedules_are_plain_inserts_a_stored_sagas_replace_by_name() -> None:
    log = Log()
    fresh = [log.event(Opened(order_id="o1")), log.event(Noted(order_id="o1", note="cancel"))]
    ws = _plan(_planner(), fresh, _loaded())
    # Nothing stored can carry the new saga's names: no delete statement for them.
    assert ws.deadline_deletes == []
    assert ws.deadline_inserts == []
    stored = [log.event(Noted(order_id="o2", note="reschedule"))]
    ws = _plan(_planner(), stored, _loaded(_active("o2")))
    assert ws.deadline_deletes == [(SAGA, "o2", "remind")]
    assert [(d.saga_id, d.due_at) for d in ws.deadline_inserts] == [
        ("o2", NOW + timedelta(minutes=10))
    ]


def test_deadline_ids_are_time_ordered_uuids() -> None:
    log = Log()
    records = [log.event(Opened(order_id=f"o{n}")) for n in range(50)]
    before = time.time_ns() // 1_000_000
    ws = _plan(_planner(), records, _loaded())
    after = time.time_ns() // 1_000_000
    ids = [uuid.UUID(d.id) for d in ws.deadline_inserts]
    assert len(set(ids)) == 50
    for u in ids:
        assert (u.version, u.variant) == (7, uuid.RFC_4122)
        # The leading 48 bits are the clock in milliseconds: new rows go to the index's end.
        assert before <= u.int >> 80 <= after


def test_a_duplicate_in_the_same_batch_is_recorded_not_applied() -> None:
    log = Log()
    records = [
        log.event(Opened(order_id="o1")),
        log.event(Noted(order_id="o1", note="a"), "same"),
        log.event(Noted(order_id="o1", note="a"), "same"),
    ]
    ws = _plan(_planner(), records, _loaded())
    assert _outcomes(ws) == [("o1", "applied", 1), ("o1", "applied", 2), ("o1", "duplicate", None)]
    assert len(ws.outbox) == 1
    assert ws.sagas[0].version == 2
    assert ws.counts["duplicate"] == 1


def test_a_duplicate_of_an_applied_history_row_changes_nothing() -> None:
    log = Log()
    records = [log.event(Noted(order_id="o1", note="a"), "seen-before")]
    ws = _plan(_planner(), records, _loaded(_active(), applied={(SAGA, "o1", "seen-before")}))
    assert _outcomes(ws) == [("o1", "duplicate", None)]
    assert ws.sagas == []
    assert ws.outbox == []


def test_the_same_message_id_for_another_saga_is_not_a_duplicate() -> None:
    log = Log()
    records = [log.event(Noted(order_id="o2", note="a"), "shared-id")]
    loaded = _loaded(_active("o2"), applied={(SAGA, "o1", "shared-id")})
    assert _outcomes(_plan(_planner(), records, loaded)) == [("o2", "applied", 2)]


def test_a_non_start_event_for_a_missing_saga_is_recorded_as_no_saga() -> None:
    log = Log()
    ws = _plan(_planner(), [log.event(Noted(order_id="ghost"))], _loaded())
    assert _outcomes(ws) == [("ghost", "no-saga", None)]
    assert ws.sagas == []
    assert ws.outbox == []


def test_events_after_the_end_are_ignored_in_the_same_batch_and_later() -> None:
    log = Log()
    records = [log.event(Closed(order_id="o1")), log.event(Noted(order_id="o1"))]
    ws = _plan(_planner(), records, _loaded(_active()))
    assert _outcomes(ws) == [("o1", "applied", 2), ("o1", "ignored-ended", None)]
    assert (ws.sagas[0].status, ws.deadline_clears) == (ENDED, [(SAGA, "o1")])
    assert ws.outbox == []

    ended = SagaRow(SAGA, "o1", {"order_id": "o1", "notes": []}, ENDED, 2)
    ws2 = _plan(_planner(), [log.event(Noted(order_id="o1"))], _loaded(ended))
    assert _outcomes(ws2) == [("o1", "ignored-ended", None)]
    assert ws2.sagas == []


def test_a_purged_saga_stays_ended_a_redelivered_start_event_starts_nothing() -> None:
    log = Log()
    loaded = dataclasses.replace(_loaded(), tombstones=frozenset({(SAGA, "o1")}))
    records = [
        log.event(Opened(order_id="o1"), "start-1"),  # the start event, redelivered
        log.event(Noted(order_id="o1"), "note-1"),
        log.fired(D1, 4, saga_id="o1"),
        log.event(Opened(order_id="o2"), "start-2"),  # another saga starts as usual
    ]
    ws = _plan(_planner(), records, dataclasses.replace(loaded, lease_token=4))
    assert _outcomes(ws) == [
        ("o1", "ignored-ended", None),
        ("o1", "ignored-ended", None),
        ("o1", "deadline-stale", None),
        ("o2", "applied", 1),
    ]
    assert ws.history[0].detail == "ended; purged by retention"
    assert [(s.saga_id, s.status) for s in ws.sagas] == [("o2", ACTIVE)]
    assert ws.outbox == []
    assert ws.deadline_resets == []
    assert [d.saga_id for d in ws.deadline_inserts] == ["o2"]


def test_a_missing_association_value_is_dead_lettered_with_its_source() -> None:
    log = Log()
    record = log.event(Noted(order_id="", note="x"))
    items, wants = _planner().route([decode(record, REG, 1 << 20)])
    assert [(type(i), getattr(i, "reason", None)) for i in items] == [
        (Rejected, Reason.MISSING_ASSOCIATION)
    ]
    assert wants.saga_keys == set()
    ws = _planner().plan(items, _loaded(), NOW)
    [dead] = ws.dead_letters
    assert (dead.reason, dead.record) == ("missing-association", record)
    [row] = ws.outbox
    assert row.topic == DEAD
    assert row.value == record.value
    assert row.headers["dead-letter-reason"] == "missing-association"
    assert (row.headers["source-topic"], row.headers["source-offset"]) == ("in", str(record.offset))
    assert row.headers["message-id"] == "m-1"  # the original headers travel along


def test_a_failing_handler_is_retried_then_parks_its_saga_and_holds_later_messages() -> None:
    gate = Gate(failures=100)
    log = Log()
    records = [
        log.event(Noted(order_id="o1", note="a")),
        log.event(Opened(order_id="o2")),
        log.event(Noted(order_id="o1", note="b")),
        log.fired(D1, 5),
    ]
    ref = DeadlineRef(SAGA, "o1", "remind", NOW, None, 5)
    loaded = _loaded(_active(), deadlines={D1: ref}, lease=5)
    ws = _plan(_planner(gate, attempts=3), records, loaded)
    # Three attempts at o1's handler and three at o2's start; none for the held messages.
    assert gate.calls == 6
    assert _outcomes(ws) == [
        ("o1", "parked", 2),
        ("o2", "parked", 1),
        ("o1", "parked-behind", 3),
        ("o1", "parked-behind", 4),
    ]
    assert [(p.saga_id, p.record.offset) for p in ws.parked] == [
        ("o1", 1),
        ("o2", 2),
        ("o1", 3),
        ("o1", 4),
    ]
    assert "gate closed" in ws.parked[0].reason
    assert ws.parked[2].reason == "behind a parked saga"
    by_id = {s.saga_id: s for s in ws.sagas}
    assert (by_id["o1"].status, by_id["o1"].version, by_id["o1"].expected_version) == (PARKED, 4, 1)
    assert by_id["o1"].state == {"order_id": "o1", "notes": []}  # untouched by the failure
    assert by_id["o1"].parked_reason is not None
    assert "RuntimeError: gate closed" in by_id["o1"].parked_reason
    # A saga whose start failed is stored without state, so a retry can start it later.
    assert (by_id["o2"].state, by_id["o2"].status, by_id["o2"].expected_version) == (
        None,
        PARKED,
        None,
    )
    assert ws.outbox == []
    assert ws.deadline_deletes == []  # the fired deadline waits with the saga
    assert ws.counts["handler-failed"] == 2


def test_a_handler_that_recovers_within_its_attempts_applies_once() -> None:
    gate = Gate(failures=2)
    ws = _plan(_planner(gate, attempts=3), [Log().event(Noted(order_id="o1"))], _loaded(_active()))
    assert gate.calls == 3
    assert _outcomes(ws) == [("o1", "applied", 2)]
    assert len(ws.outbox) == 1


def test_other_sagas_flow_while_one_is_parked() -> None:
    log = Log()
    parked = SagaRow(SAGA, "o1", {"order_id": "o1", "notes": []}, PARKED, 3, "boom")
    records = [log.event(Noted(order_id="o1", note="held")), log.event(Noted(order_id="o2"))]
    ws = _plan(_planner(), records, _loaded(parked, _active("o2")))
    assert _outcomes(ws) == [("o1", "parked-behind", 4), ("o2", "applied", 2)]
    by_id = {s.saga_id: s for s in ws.sagas}
    assert (by_id["o1"].status, by_id["o1"].parked_reason) == (PARKED, "boom")
    assert [p.record.offset for p in ws.parked] == [1]


def test_a_duplicate_of_an_applied_message_is_not_held_behind_a_parked_saga() -> None:
    parked = SagaRow(SAGA, "o1", {"order_id": "o1", "notes": []}, PARKED, 3, "boom")
    record = Log().event(Noted(order_id="o1"), "old")
    ws = _plan(_planner(), [record], _loaded(parked, applied={(SAGA, "o1", "old")}))
    assert _outcomes(ws) == [("o1", "duplicate", None)]
    assert ws.parked == []


def test_a_row_planned_as_not_started_keeps_its_version() -> None:
    # An operator's retry of a saga whose start failed: the row exists without state.
    row = SagaRow(SAGA, "o1", None, None, 3)
    log = Log()
    records = [log.event(Opened(order_id="o1")), log.event(Noted(order_id="o1", note="a"))]
    ws = _plan(_planner(), records, _loaded(row))
    assert _outcomes(ws) == [("o1", "applied", 4), ("o1", "applied", 5)]
    [write] = ws.sagas
    assert (write.status, write.version, write.expected_version) == (ACTIVE, 5, 3)


def test_a_row_planned_as_not_started_ignores_non_start_events() -> None:
    ws = _plan(
        _planner(), [Log().event(Noted(order_id="o1"))], _loaded(SagaRow(SAGA, "o1", None, None, 3))
    )
    assert _outcomes(ws) == [("o1", "no-saga", None)]
    assert ws.sagas == []


# -- fired deadlines ---------------------------------------------------------------------------

TOKEN = 7


def _ref(token: int | None = TOKEN) -> DeadlineRef:
    return DeadlineRef(SAGA, "o1", "remind", NOW - timedelta(seconds=1), None, token)


def test_a_fresh_fired_deadline_runs_its_handler_and_is_consumed() -> None:
    log = Log()
    loaded = _loaded(_active(), deadlines={D1: _ref()}, lease=TOKEN)
    ws = _plan(_planner(), [log.fired(D1, TOKEN)], loaded)
    assert [(h.message_id, h.outcome, h.kind) for h in ws.history] == [
        (f"deadline:{D1}", "applied", "deadline")
    ]
    assert ws.deadline_deletes == [(SAGA, "o1", "remind")]
    assert ws.deadline_inserts == []
    assert [json.loads(o.value)["note"] for o in ws.outbox] == ["reminder"]


def test_a_deadline_fired_twice_in_one_batch_runs_once() -> None:
    log = Log()
    loaded = _loaded(_active(), deadlines={D1: _ref()}, lease=TOKEN)
    ws = _plan(_planner(), [log.fired(D1, TOKEN), log.fired(D1, TOKEN)], loaded)
    assert [h.outcome for h in ws.history] == ["applied", "deadline-stale"]
    assert len(ws.outbox) == 1


@pytest.mark.parametrize(
    ("case", "expected_deletes"),
    [
        ("cancelled-earlier-in-batch", [(SAGA, "o1", "remind")]),
        ("rescheduled-earlier-in-batch", [(SAGA, "o1", "remind")]),
        ("row-gone", []),
        ("wrong-token", []),
        ("lease-moved-on", []),
        ("no-lease", []),
        ("saga-ended", []),
        ("ended-earlier-in-batch", []),
    ],
)
def test_a_stale_fired_deadline_is_a_recorded_no_op(
    case: str, expected_deletes: list[tuple[str, str, str]]
) -> None:
    log = Log()
    row = _active()
    deadlines: dict[str, DeadlineRef] = {D1: _ref()}
    lease: int | None = TOKEN
    records: list[Record] = []
    if case == "cancelled-earlier-in-batch":
        records.append(log.event(Noted(order_id="o1", note="cancel")))
    elif case == "rescheduled-earlier-in-batch":
        records.append(log.event(Noted(order_id="o1", note="reschedule")))
    elif case == "row-gone":
        deadlines = {}
    elif case == "wrong-token":
        deadlines = {D1: _ref(token=TOKEN - 1)}
    elif case == "lease-moved-on":
        lease = TOKEN + 1
    elif case == "no-lease":
        lease = None
    elif case == "saga-ended":
        row = SagaRow(SAGA, "o1", row.state, ENDED, 5)
    elif case == "ended-earlier-in-batch":
        records.append(log.event(Closed(order_id="o1")))
    records.append(log.fired(D1, TOKEN))
    ws = _plan(_planner(), records, _loaded(row, deadlines=deadlines, lease=lease))
    assert ws.history[-1].outcome == "deadline-stale"
    assert ws.history[-1].version is None
    assert not any(json.loads(o.value)["note"] == "reminder" for o in ws.outbox)
    assert ws.deadline_deletes == expected_deletes
    if case == "rescheduled-earlier-in-batch":
        # The new schedule survives the stale fire of the old one.
        assert [(d.name, d.due_at) for d in ws.deadline_inserts] == [
            ("remind", NOW + timedelta(minutes=10))
        ]


def test_a_fired_deadline_for_an_unknown_saga_type_is_dead_lettered() -> None:
    log = Log()
    record = log.fired(D1, TOKEN)
    body: dict[str, Any] = json.loads(record.value or b"")
    body["saga_type"] = "nobody"
    other = Record(
        record.topic, 0, record.offset, record.key, json.dumps(body).encode(), record.headers
    )
    items, _ = _planner().route([decode(other, REG, 1 << 20)])
    ws = _planner().plan(items, _loaded(), NOW)
    assert [d.reason for d in ws.dead_letters] == ["unknown-type"]
    assert ws.history == []


# -- one saga's failures park it; the planner never raises --------------------------------------


def test_stored_state_that_no_longer_loads_parks_the_saga_without_its_values() -> None:
    log = Log()
    bad = SagaRow(SAGA, "o1", {"order_id": "o1", "notes": "secret-value"}, ACTIVE, 4)
    records = [
        log.event(Noted(order_id="o1", note="a")),
        log.event(Noted(order_id="o2", note="b")),
        log.event(Noted(order_id="o1", note="c")),
    ]
    ws = _plan(_planner(), records, _loaded(bad, _active("o2")))
    assert _outcomes(ws) == [("o1", "parked", 5), ("o2", "applied", 2), ("o1", "parked-behind", 6)]
    by_id = {s.saga_id: s for s in ws.sagas}
    parked = by_id["o1"]
    assert (parked.status, parked.expected_version) == (PARKED, 4)
    assert parked.state == bad.state  # written back untouched, for the fixed deploy to read
    assert parked.parked_reason is not None
    assert "ValidationError at notes" in parked.parked_reason
    assert "OrderSaga" in parked.parked_reason
    assert "secret-value" not in parked.parked_reason
    assert [p.record.offset for p in ws.parked] == [1, 3]


def test_an_ended_saga_whose_state_no_longer_loads_still_ignores_events() -> None:
    bad = SagaRow(SAGA, "o1", {"notes": 5}, ENDED, 4)
    ws = _plan(_planner(), [Log().event(Noted(order_id="o1"))], _loaded(bad))
    assert _outcomes(ws) == [("o1", "ignored-ended", None)]
    assert ws.sagas == []


class Unregistered(Message):
    order_id: str


@saga(type="unit-sender")
class SenderSaga(SagaState):
    order_id: str = ""

    @saga_event_handler(Opened, association_property="order_id", start=True)
    def opened(self, event: Opened, commands: SagaCommands) -> None:
        self.order_id = event.order_id
        commands.send(Ship(order_id=event.order_id, note="first"))
        commands.send(Unregistered(order_id=event.order_id), topic="elsewhere")


def test_a_command_of_an_unregistered_class_parks_the_saga_and_applies_nothing() -> None:
    sagas = bind_all([SenderSaga], registry=REG)
    planner = Planner(sagas, registry=REG, dead_letter_topic=DEAD)
    items, _ = planner.route([decode(Log().event(Opened(order_id="o1")), REG, 1 << 20)])
    ws = planner.plan(items, _loaded(), NOW)
    assert [h.outcome for h in ws.history] == ["parked"]
    assert ws.outbox == []  # not even the first, registered command
    [write] = ws.sagas
    assert (write.status, write.state) == (PARKED, None)
    assert write.parked_reason is not None
    assert "opened: command 1 (Unregistered): UnknownMessageType" in write.parked_reason


def test_a_state_validation_error_in_a_handler_is_reported_by_location_only() -> None:
    @saga(type="unit-strict")
    class Strict(SagaState):
        order_id: str = ""
        count: int = 0

        @saga_event_handler(Noted, association_property="order_id", start=True)
        def noted(self, event: Noted) -> None:
            self.count = event.note  # type: ignore[assignment]

    planner = Planner(bind_all([Strict], registry=REG), registry=REG, dead_letter_topic=DEAD)
    record = Log().event(Noted(order_id="o1", note="personal-data"))
    items, _ = planner.route([decode(record, REG, 1 << 20)])
    ws = planner.plan(items, _loaded(), NOW)
    [write] = ws.sagas
    assert write.parked_reason is not None
    assert write.parked_reason.startswith("noted: ValidationError at count:")
    assert "personal-data" not in write.parked_reason


def test_an_association_value_the_store_cannot_hold_is_dead_lettered() -> None:
    log = Log()
    # Keyed apart from the association, so only the association value is at fault.
    records = [
        dataclasses.replace(log.event(Opened(order_id=v)), key=b"k")
        for v in ("o\x00x", "o" * 600, "o1")
    ]
    ws = _plan(_planner(), records, _loaded())
    assert [(d.reason, d.detail) for d in ws.dead_letters] == [
        ("invalid-text", "the value holds a NUL character"),  # judged by decode already
        ("invalid-id", "order_id is over 512 bytes"),
    ]
    assert _outcomes(ws) == [("o1", "applied", 1)]


# -- fired deadlines: kept on failure, matched to their saga ------------------------------------


def test_a_failed_deadline_handler_keeps_its_deadline_and_a_replay_runs_it() -> None:
    gate = Gate(failures=100)
    log = Log()
    fired = log.fired(D1, TOKEN)
    ref = DeadlineRef(SAGA, "o1", "remind", NOW - timedelta(seconds=1), {"n": 1}, TOKEN)

    @saga(type="unit-remind")
    class Remind(SagaState):
        order_id: str = ""
        seen: list[int] = Field(default_factory=list)

        @saga_event_handler(Opened, association_property="order_id", start=True)
        def opened(self, event: Opened) -> None:
            self.order_id = event.order_id

        @saga_deadline_handler("remind")
        def remind(self, payload: dict[str, int], gate: Gate) -> None:
            gate.check()
            self.seen.append(payload["n"])

    sagas = bind_all([Remind], dependencies={Gate: gate}, registry=REG)
    planner = Planner(sagas, registry=REG, dead_letter_topic=DEAD)
    body = json.loads(fired.value or b"")
    body["saga_type"] = "unit-remind"
    fired = Record("in", 0, 1, b"o1", json.dumps(body).encode(), fired.headers)
    ref = DeadlineRef("unit-remind", "o1", "remind", ref.due_at, {"n": 1}, TOKEN)
    row = SagaRow("unit-remind", "o1", {"order_id": "o1", "seen": []}, ACTIVE, 2)
    items, _ = planner.route([decode(fired, REG, 1 << 20)])
    ws = planner.plan(items, _loaded(row, deadlines={D1: ref}, lease=TOKEN), NOW)
    assert [h.outcome for h in ws.history] == ["parked"]
    assert ws.deadline_deletes == []
    assert ws.deadline_clears == []
    # The fix is deployed; the retry replays the held record although the lease moved on.
    gate.failures = 0
    ws = planner.plan(items, _loaded(row, deadlines={D1: ref}, lease=TOKEN + 3), NOW, replay=True)
    assert [h.outcome for h in ws.history] == ["applied"]
    assert ws.sagas[0].state == {"order_id": "o1", "seen": [1]}
    assert ws.deadline_deletes == [("unit-remind", "o1", "remind")]


def test_a_fired_record_for_another_sagas_deadline_is_rejected() -> None:
    log = Log()
    forged = log.fired(D1, TOKEN, saga_id="o2")  # right id and token, wrong saga
    loaded = _loaded(_active(), _active("o2"), deadlines={D1: _ref()}, lease=TOKEN)
    ws = _plan(_planner(), [forged, log.fired(D1, TOKEN, name="other")], loaded)
    assert [(h.saga_id, h.outcome) for h in ws.history] == [
        ("o2", "deadline-rejected"),
        ("o1", "deadline-rejected"),
    ]
    assert ws.outbox == []
    assert ws.sagas == []
    assert ws.deadline_deletes == []


def test_a_fired_deadline_without_a_handler_parks_and_keeps_its_row() -> None:
    log = Log()
    ref = DeadlineRef(SAGA, "o1", "gone", NOW - timedelta(seconds=1), None, TOKEN)
    loaded = _loaded(_active(), deadlines={D1: ref}, lease=TOKEN)
    ws = _plan(_planner(), [log.fired(D1, TOKEN, name="gone")], loaded)
    assert [h.outcome for h in ws.history] == ["parked"]
    assert ws.parked[0].reason == "no deadline handler for 'gone'"
    assert ws.deadline_deletes == []


def test_a_record_of_an_outdated_token_resets_a_row_still_dispatched_under_it() -> None:
    log = Log()
    loaded = _loaded(_active(), deadlines={D1: _ref()}, lease=TOKEN + 1)
    ws = _plan(_planner(), [log.fired(D1, TOKEN)], loaded)
    assert [h.outcome for h in ws.history] == ["deadline-stale"]
    assert ws.deadline_resets == [(D1, TOKEN)]
    # Dispatched under the new token already: that record is on its way; nothing to reset.
    loaded = _loaded(_active(), deadlines={D1: _ref(token=TOKEN + 1)}, lease=TOKEN + 1)
    assert _plan(_planner(), [log.fired(D1, TOKEN)], loaded).deadline_resets == []


def test_dead_letters_of_records_with_nul_headers_are_storable() -> None:
    record = Record("in", 0, 1, b"o1", b"{}", (("message-id", b"m\x00"), ("x\x00", b"v")))
    ws = _plan(_planner(), [record], _loaded())
    [dl] = ws.dead_letters
    assert dl.reason == "invalid-header"
    assert not any("\x00" in k or b"\x00" in v for k, v in dl.record.headers)
    assert not any("\x00" in k or "\x00" in v for k, v in ws.outbox[0].headers.items())
    assert ws.outbox[0].value == b"{}"
