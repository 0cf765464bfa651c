"""`show` on a saga function: its journal as a table, the await it is suspended on with its
timer, and whether it is undoing what it did; read from states the trip function really stores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from processor._cli import inspect as cli_inspect
from processor._cli import main
from processor._invocation import state_to_json
from processor._ports.views import SagaSummary
from processor.ops._journal import function_journal
from processor.testing import SagaFixture
from sagas.trip import TripSaga
from sagas.trip_function import trip_function
from schemas import trips as t

TID = "t-1"
BOOKING = t.TripRequested(
    trip_id=TID, traveller_id="ada", flight="LH 123", hotel="Adlon", amount=Decimal("812.40")
)
START = datetime(2026, 1, 1, tzinfo=UTC)


class _Store:
    """The reads `show` makes, over one stored state."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def saga(self, saga_type: str, saga_id: str) -> tuple[SagaSummary, dict[str, Any]]:
        summary = SagaSummary(saga_type, saga_id, "active", None, START, 3, START, START, None)
        return summary, self.state

    def deadlines(self, *_: str) -> list[Any]:
        return []

    def held(self, *_: str) -> list[Any]:
        return []

    def failed(self, *_: str) -> list[Any]:
        return []

    def timeline(self, *_: str, **__: Any) -> list[Any]:
        return []

    def audit(self, **_: Any) -> list[Any]:
        return []


def _stored(f: SagaFixture) -> dict[str, Any]:
    assert f.state is not None
    return state_to_json(f.state)


def _show(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], f: SagaFixture, *flags: str
) -> str:
    stored = json.loads(json.dumps(_stored(f)))  # as the database hands it back

    @contextmanager
    def queries(_settings: object) -> Iterator[_Store]:
        yield _Store(stored)

    monkeypatch.setattr(cli_inspect, "inspect_queries", queries)
    # Nothing listens there: the reads above are all `show` makes.
    monkeypatch.setenv("SAGA_DATABASE__URL", "postgresql://saga@127.0.0.1:1/saga")
    assert main(["show", "trip-function", TID, *flags]) == 0
    return capsys.readouterr().out


def _journal_rows(out: str) -> list[list[str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("journal ("))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("  "):
            break
        rows.append(line.split())
    return rows


def test_a_running_saga_function_shows_its_journal_and_the_call_it_waits_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    f = SagaFixture(trip_function)
    f.when(BOOKING)
    f.when(t.FlightReserved(trip_id=TID))
    out = _show(monkeypatch, capsys, f)
    assert "journal (1 entry):" in out
    assert "  #  KIND  WHAT                 OUTCOME  ATTEMPTS  REPLY                 AT" in out
    assert _journal_rows(out) == [
        ["0", "call", "trips.ReserveFlight", "ok", "1", "trips.FlightReserved", START.isoformat()]
    ]
    timer = "2026-01-01T00:00:10+00:00"
    assert (
        f"pending   #1 call trips.ReserveHotel, attempt 1 of 4, times out {timer} "
        "(10 s an attempt), expects trips.HotelReserved"
    ) in out.splitlines()
    assert "deadline  2026-01-01T00:10:00+00:00 (the saga's own)" in out
    assert "aborted" not in out
    # Payload values stay in the state: the journal's lines name messages only.
    journal_part = out[out.index("journal (") : out.index("deadlines:")]
    assert "LH 123" not in journal_part
    assert "Adlon" not in journal_part


def test_a_call_backing_off_shows_when_its_next_attempt_goes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    f = SagaFixture(trip_function).given(BOOKING, t.FlightReserved(trip_id=TID))
    f.when(t.HotelFailed(trip_id=TID, reason="overbooked"))
    state = _stored(f)
    pending = state["pending"]
    assert pending["backing_off"] is True
    due = datetime.fromisoformat(pending["timer_at"])
    out = _show(monkeypatch, capsys, f)
    assert (
        f"pending   #1 call trips.ReserveHotel, attempt 1 of 4, attempt 2 due {due.isoformat()}"
    ) in out


def test_a_saga_function_undoing_shows_why_and_the_undo_it_waits_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    f = SagaFixture(trip_function).given(
        BOOKING, t.FlightReserved(trip_id=TID), t.HotelReserved(trip_id=TID)
    )
    f.when(t.ChargeDeclined(trip_id=TID, reason="card refused"))
    out = _show(monkeypatch, capsys, f)
    assert [row[:6] for row in _journal_rows(out)] == [
        ["0", "call", "trips.ReserveFlight", "ok", "1", "trips.FlightReserved"],
        ["1", "call", "trips.ReserveHotel", "ok", "1", "trips.HotelReserved"],
        ["2", "call", "trips.ChargeTrip", "rejected", "1", "trips.ChargeDeclined"],
    ]
    assert "pending   #3 undo trips.CancelHotel, attempt 1" in out
    assert "aborted   undoing what it did: trips.ChargeTrip: card refused" in out

    # The same in one JSON document, as the console's API serves it.
    data = json.loads(_show(monkeypatch, capsys, f, "--json"))
    journal = data["journal"]
    assert journal["compensating"] is True
    assert [e["outcome"] for e in journal["entries"]] == ["ok", "ok", "rejected"]
    assert journal["pending"]["kind"] == "undo"
    assert journal["pending"]["expects"] == ["trips.HotelCancelled"]


def test_other_sagas_have_no_journal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    f = SagaFixture(TripSaga)
    f.when(t.BookTrip(**BOOKING.model_dump()))
    assert function_journal(_stored(f)) is None
    assert function_journal(None) is None
    # A field named journal alone is a plain saga's own business.
    assert function_journal({"journal": []}) is None
    out = _show(monkeypatch, capsys, f)
    assert "journal" not in out
    assert "pending   " not in out


def test_a_journal_read_leniently_from_what_an_older_release_stored() -> None:
    found = function_journal(
        {
            "journal": [{"seq": 0, "kind": "sleep", "what": "timer", "at": "not a time"}, "junk"],
            "pending": {"seq": 1, "kind": "wait", "what": "x.Paid", "timeout": "PT30M"},
        }
    )
    assert found is not None
    [entry] = found.entries
    assert (entry.kind, entry.outcome, entry.at, entry.reply) == ("sleep", "ok", None, None)
    assert found.pending is not None
    assert found.pending.timeout is not None
    assert found.pending.timeout.total_seconds() == 1800
