"""The copy of a saga function's state a handler run works on (FunctionState.__deepcopy__): a
journal of its own holding the same frozen entries, a pending await of its own."""

from __future__ import annotations

from decimal import Decimal

import pydantic
import pytest

from processor._authoring.functions import Entry, FunctionState
from processor._invocation.state import working_copy
from processor.testing import SagaFixture
from sagas.trip_function import trip_function
from schemas import trips


def _state() -> FunctionState:
    fx = SagaFixture(trip_function)
    fx.when(
        trips.TripRequested(
            trip_id="t-1", traveller_id="a", flight="F1", hotel="H1", amount=Decimal("10")
        )
    )
    fx.when(trips.FlightReserved(trip_id="t-1"))
    state = fx.state
    assert isinstance(state, FunctionState)
    return state


def test_a_working_copy_shares_the_entries_in_a_journal_of_its_own() -> None:
    state = _state()
    copy = working_copy(state)
    assert copy == state
    assert copy.journal is not state.journal
    assert all(a is b for a, b in zip(copy.journal, state.journal, strict=True))
    assert copy.pending is not None
    assert copy.pending is not state.pending
    copy.journal.append(copy.journal[0])
    copy.pending.attempt = 2
    copy.late.append("noted")
    assert len(state.journal) == 1
    assert state.pending is not None
    assert state.pending.attempt == 1
    assert state.late == []


def test_an_entry_cannot_change_once_made() -> None:
    entry = _state().journal[0]
    assert isinstance(entry, Entry)
    with pytest.raises(pydantic.ValidationError):
        entry.outcome = "rejected"  # type: ignore[misc]


def test_the_saga_runs_on_as_before() -> None:
    fx = SagaFixture(trip_function)
    fx.when(
        trips.TripRequested(
            trip_id="t-2", traveller_id="a", flight="F1", hotel="H1", amount=Decimal("10")
        )
    )
    fx.when(trips.FlightReserved(trip_id="t-2"))
    fx.when(trips.HotelReserved(trip_id="t-2"))
    fx.when(trips.ChargeDeclined(trip_id="t-2", reason="no funds"))
    fx.when(trips.HotelCancelled(trip_id="t-2"))
    fx.when(trips.FlightCancelled(trip_id="t-2")).expect_ended()
    assert fx.pending_deadlines == {}
