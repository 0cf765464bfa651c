"""The trip saga (``sagas/trip.py``) through each of its paths, in memory with virtual time."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from processor._authoring.orchestration import MachineState
from processor._invocation import state_to_json
from processor.testing import SagaFixture
from sagas.trip import TripSaga
from schemas.trips import (
    BookTrip,
    CancelFlight,
    CancelHotel,
    ChargeDeclined,
    ChargeTrip,
    EscalateTrip,
    FlightCancelFailed,
    FlightCancelled,
    FlightReserved,
    HotelCancelled,
    HotelReserved,
    HotelUnavailable,
    ReserveFlight,
    ReserveHotel,
    TripCharged,
)

TID = "trip-1"
BOOKING = BookTrip(
    trip_id=TID, traveller_id="ada", flight="LH 123", hotel="Adlon", amount=Decimal("812.40")
)
RESERVE_FLIGHT = ReserveFlight(trip_id=TID, flight="LH 123")
CANCEL_FLIGHT = CancelFlight(trip_id=TID, flight="LH 123")
RESERVE_HOTEL = ReserveHotel(trip_id=TID, hotel="Adlon")
CANCEL_HOTEL = CancelHotel(trip_id=TID, hotel="Adlon")
CHARGE = ChargeTrip(trip_id=TID, traveller_id="ada", amount=Decimal("812.40"))
S = MachineState


def _state(f: SagaFixture) -> TripSaga:
    state = f.state
    assert isinstance(state, TripSaga)
    return state


def _to_charge(f: SagaFixture) -> None:
    f.when(BOOKING).expect_commands(RESERVE_FLIGHT)
    f.when(FlightReserved(trip_id=TID)).expect_commands(RESERVE_HOTEL)
    f.when(HotelReserved(trip_id=TID)).expect_commands(CHARGE)


def test_happy_path_books_flight_then_hotel_then_charges() -> None:
    f = SagaFixture(TripSaga)
    _to_charge(f)
    # The start event is kept on the state, as stored JSON, without a line copying it.
    assert _state(f).trip == BOOKING
    assert state_to_json(_state(f))["trip"]["hotel"] == "Adlon"
    f.when(TripCharged(trip_id=TID)).expect_no_commands().expect_ended("COMPLETED")
    assert _state(f).progress.completed == ["flight", "hotel", "charge"]


def test_a_hotel_timeout_is_retried_three_times_then_the_flight_is_cancelled() -> None:
    f = SagaFixture(TripSaga)
    f.when(BOOKING)
    f.when(FlightReserved(trip_id=TID)).expect_commands(RESERVE_HOTEL)
    # Each attempt waits 10 s; the retries back off from 2 s. Two minutes see them all out.
    r = f.when_time_elapses(timedelta(minutes=2))
    r.expect_commands(RESERVE_HOTEL, RESERVE_HOTEL, RESERVE_HOTEL, CANCEL_FLIGHT)
    assert _state(f).machine_state == S.COMPENSATING
    assert _state(f).progress.reason == "step hotel timed out"
    f.when(FlightCancelled(trip_id=TID)).expect_no_commands().expect_ended("COMPENSATED")


def test_a_declined_payment_cancels_the_hotel_then_the_flight() -> None:
    f = SagaFixture(TripSaga)
    _to_charge(f)
    f.when(ChargeDeclined(trip_id=TID, reason="card expired")).expect_commands(CANCEL_HOTEL)
    f.when(HotelCancelled(trip_id=TID)).expect_commands(CANCEL_FLIGHT)
    f.when(FlightCancelled(trip_id=TID)).expect_no_commands().expect_ended("COMPENSATED")
    assert _state(f).progress.undone == ["hotel", "flight"]


def test_a_payment_timeout_after_30_seconds_compensates() -> None:
    f = SagaFixture(TripSaga)
    _to_charge(f)
    f.when_time_elapses(timedelta(seconds=29)).expect_no_commands()
    f.when_time_elapses(timedelta(seconds=1)).expect_commands(CANCEL_HOTEL)
    assert _state(f).progress.reason == "step charge timed out"
    f.when(HotelCancelled(trip_id=TID)).expect_commands(CANCEL_FLIGHT)
    f.when(FlightCancelled(trip_id=TID)).expect_ended("COMPENSATED")


def test_a_flight_cancel_that_keeps_failing_goes_to_a_person_and_the_saga_waits() -> None:
    f = SagaFixture(TripSaga)
    f.when(BOOKING)
    f.when(FlightReserved(trip_id=TID))
    f.when(HotelUnavailable(trip_id=TID, reason="full")).expect_commands(CANCEL_FLIGHT)
    # The cancel is retried with backoff (five attempts in all), then a person is asked.
    for _ in range(4):
        f.when(FlightCancelFailed(trip_id=TID, reason="non-refundable")).expect_no_commands()
        f.when_time_elapses(timedelta(minutes=5)).expect_commands(CANCEL_FLIGHT)
    r = f.when(FlightCancelFailed(trip_id=TID, reason="non-refundable"))
    r.expect_commands(
        EscalateTrip(
            trip_id=TID,
            reason="compensation-failed",
            step="flight",
            machine_state="WAITING",
            detail="undo of flight failed: non-refundable",
        )
    )
    r.expect_active()
    assert r.waiting == "undo of flight failed: non-refundable"
    assert _state(f).machine_state == S.WAITING


def test_the_ten_minute_deadline_times_the_trip_out_and_undoes_a_late_flight() -> None:
    f = SagaFixture(TripSaga)
    f.when(BOOKING).expect_deadline_scheduled("machine.deadline", after=timedelta(minutes=10))
    # The airline has not answered when the trip's ten minutes are up.
    f.when_time_elapses(timedelta(minutes=9, seconds=59)).expect_no_commands()
    f.when_time_elapses(timedelta(seconds=1)).expect_no_commands()
    assert _state(f).progress.timed_out
    assert _state(f).progress.in_doubt == ["flight"]
    # Its confirmation lands late: the seat is held after all, so it is cancelled.
    f.when(FlightReserved(trip_id=TID)).expect_commands(CANCEL_FLIGHT)
    f.when(FlightCancelled(trip_id=TID)).expect_ended("TIMED_OUT")


def test_a_new_wait_on_a_person_is_counted_once_by_kind_for_the_metrics() -> None:
    """saga_escalations_total{kind="undo"} pages (SagaCompensationFailed); reminders of the same
    wait are not counted again."""
    from collections import Counter
    from typing import Any

    f = SagaFixture(TripSaga)
    counted: Counter[tuple[str, str]] = Counter()
    run = f._engine.run

    def counting(*args: Any) -> Any:
        batch = run(*args)
        counted.update(batch.ws.escalations)
        return batch

    f._engine.run = counting  # type: ignore[method-assign,assignment]
    f.when(BOOKING)
    f.when(FlightReserved(trip_id=TID))
    f.when(HotelUnavailable(trip_id=TID, reason="full"))
    for _ in range(4):
        f.when(FlightCancelFailed(trip_id=TID, reason="non-refundable"))
        f.when_time_elapses(timedelta(minutes=5))
    assert counted == Counter()
    f.when(FlightCancelFailed(trip_id=TID, reason="non-refundable")).expect_active()
    assert counted == Counter({("trip-saga", "undo"): 1})
    f.when_time_elapses(timedelta(days=3))  # reminders every escalation_timeout
    assert counted == Counter({("trip-saga", "undo"): 1})
