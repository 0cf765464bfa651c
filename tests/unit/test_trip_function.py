"""The trip saga written as one function (``sagas/trip_function.py``) through each of its paths."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from processor._authoring.functions import FunctionState
from processor._authoring.functions.turn import DEADLINE, TIMER
from processor._authoring.handles import ScheduleDeadline
from processor.testing import SagaFixture
from processor.testing._result import Result
from sagas.trip_function import trip_function
from schemas.trips import (
    CancelFlight,
    CancelHotel,
    ChargeDeclined,
    ChargeTrip,
    EscalateTrip,
    FlightCancelFailed,
    FlightCancelled,
    FlightReserved,
    HotelCancelFailed,
    HotelCancelled,
    HotelFailed,
    HotelReserved,
    HotelUnavailable,
    ReserveFlight,
    ReserveHotel,
    TripCharged,
    TripDecided,
    TripRequested,
)

TID = "trip-1"
LATE_WINDOW = timedelta(minutes=10)  # Undo's default: how long a call in doubt is listened for
TRIP = TripRequested(
    trip_id=TID, traveller_id="ada", flight="LH 123", hotel="Adlon", amount=Decimal("812.40")
)
RESERVE_FLIGHT = ReserveFlight(trip_id=TID, flight="LH 123")
CANCEL_FLIGHT = CancelFlight(trip_id=TID, flight="LH 123")
RESERVE_HOTEL = ReserveHotel(trip_id=TID, hotel="Adlon")
CANCEL_HOTEL = CancelHotel(trip_id=TID, hotel="Adlon")
CHARGE = ChargeTrip(trip_id=TID, traveller_id="ada", amount=Decimal("812.40"))


def _state(f: SagaFixture) -> FunctionState:
    state = f.state
    assert isinstance(state, FunctionState)
    return state


def _outcomes(f: SagaFixture) -> list[tuple[str, str, str]]:
    """The journal as (kind, what, outcome): what each await asked for and how it ended."""
    return [(e.kind, e.what, e.outcome) for e in _state(f).journal]


def _to_hotel(f: SagaFixture) -> None:
    f.when(TRIP).expect_commands(RESERVE_FLIGHT)
    f.when(FlightReserved(trip_id=TID)).expect_commands(RESERVE_HOTEL)


def _to_charge(f: SagaFixture) -> None:
    _to_hotel(f)
    f.when(HotelReserved(trip_id=TID)).expect_commands(CHARGE)


def _timers(r: Result) -> list[tuple[timedelta, dict[str, int]]]:
    """Each await timer the step scheduled: how far ahead, and for which await and attempt."""
    return [
        (op.due_at - at, dict(op.payload or {}))
        for op, at in r.deadline_ops
        if isinstance(op, ScheduleDeadline) and op.name == TIMER
    ]


def test_happy_path_reserves_the_flight_then_the_hotel_then_charges_and_completes() -> None:
    f = SagaFixture(trip_function)
    r = f.when(TRIP).expect_commands(RESERVE_FLIGHT)
    r.expect_deadline_scheduled(DEADLINE, after=timedelta(minutes=10))
    r.expect_deadline_scheduled(TIMER, after=timedelta(minutes=15))
    r = f.when(FlightReserved(trip_id=TID)).expect_commands(RESERVE_HOTEL)
    r.expect_deadline_scheduled(TIMER, after=timedelta(seconds=10))
    r = f.when(HotelReserved(trip_id=TID)).expect_commands(CHARGE)
    r.expect_deadline_scheduled(TIMER, after=timedelta(seconds=30))
    r = f.when(TripCharged(trip_id=TID)).expect_no_commands()
    r.expect_ended("COMPLETED").expect_no_deadlines()
    assert _outcomes(f) == [
        ("call", "trips.ReserveFlight", "ok"),
        ("call", "trips.ReserveHotel", "ok"),
        ("call", "trips.ChargeTrip", "ok"),
    ]
    state = _state(f)
    assert getattr(state, "start", None) == TRIP
    assert state.pending is None
    assert state.aborted is None
    assert not state.compensating


def test_a_declined_charge_cancels_the_hotel_then_the_flight() -> None:
    f = SagaFixture(trip_function)
    _to_charge(f)
    f.when(ChargeDeclined(trip_id=TID, reason="card expired")).expect_commands(CANCEL_HOTEL)
    assert _state(f).compensating
    assert _state(f).aborted == "trips.ChargeTrip: card expired"
    f.when(HotelCancelled(trip_id=TID)).expect_commands(CANCEL_FLIGHT)
    r = f.when(FlightCancelled(trip_id=TID)).expect_no_commands()
    r.expect_ended("COMPENSATED").expect_no_deadlines()
    assert _outcomes(f)[2:] == [
        ("call", "trips.ChargeTrip", "rejected"),
        ("undo", "trips.CancelHotel", "ok"),
        ("undo", "trips.CancelFlight", "ok"),
    ]


def test_a_hotel_timeout_is_retried_after_a_backoff_and_the_trip_goes_on() -> None:
    f = SagaFixture(trip_function)
    _to_hotel(f)
    # No reply in 10 s: the next attempt waits out a backoff of at most 2 s (jittered down).
    r = f.when_time_elapses(timedelta(seconds=10)).expect_no_commands()
    [(backoff, payload)] = _timers(r)
    assert timedelta(seconds=1) <= backoff <= timedelta(seconds=2)
    assert payload == {"seq": 1, "attempt": 1}
    r = f.when_time_elapses(backoff).expect_commands(RESERVE_HOTEL)
    assert _timers(r) == [(timedelta(seconds=10), {"seq": 1, "attempt": 2})]
    pending = _state(f).pending
    assert pending is not None
    assert (pending.what, pending.attempt, pending.backing_off) == ("trips.ReserveHotel", 2, False)
    f.when(HotelReserved(trip_id=TID)).expect_commands(CHARGE)
    [_, hotel] = _state(f).journal
    assert (hotel.outcome, hotel.attempts, hotel.undo) == ("ok", 2, None)


def test_a_hotel_that_never_answers_four_attempts_cancels_the_flight() -> None:
    f = SagaFixture(trip_function)
    _to_hotel(f)
    r = f.when_time_elapses(timedelta(minutes=2))
    r.expect_commands(RESERVE_HOTEL, RESERVE_HOTEL, RESERVE_HOTEL, CANCEL_FLIGHT)
    timers = _timers(r)
    # Timeout, backoff, timeout, ...: four attempts of 10 s, the backoffs doubling from 2 s.
    assert [p for _, p in timers] == [{"seq": 1, "attempt": n} for n in (1, 2, 2, 3, 3, 4)]
    backoffs = [d for d, _ in timers[0::2]]
    assert [d for d, _ in timers[1::2]] == [timedelta(seconds=10)] * 3
    for got, ceiling in zip(backoffs, (2, 4, 8), strict=True):
        assert timedelta(seconds=ceiling / 2) <= got <= timedelta(seconds=ceiling)
    assert _state(f).aborted == "trips.ReserveHotel: no reply after 4 attempt(s)"
    f.when(FlightCancelled(trip_id=TID)).expect_no_commands()
    # The hotel may have reserved on any attempt: compensation listens for a late reservation.
    f.when_time_elapses(LATE_WINDOW).expect_no_commands().expect_ended("COMPENSATED")


def test_a_hotel_failure_reply_is_retried_like_a_timeout() -> None:
    f = SagaFixture(trip_function)
    _to_hotel(f)
    r = f.when(HotelFailed(trip_id=TID, reason="overloaded")).expect_no_commands()
    [(backoff, _)] = _timers(r)
    # A second failure of the same attempt, while backing off, is not a second attempt.
    f.when(HotelFailed(trip_id=TID, reason="overloaded")).expect_no_commands()
    f.when_time_elapses(backoff).expect_commands(RESERVE_HOTEL)
    f.when(HotelReserved(trip_id=TID)).expect_commands(CHARGE)
    hotel = _state(f).journal[1]
    assert (hotel.outcome, hotel.attempts) == ("ok", 2)


def test_a_charge_unanswered_for_30_seconds_compensates() -> None:
    f = SagaFixture(trip_function)
    _to_charge(f)
    f.when_time_elapses(timedelta(seconds=29)).expect_no_commands()
    f.when_time_elapses(timedelta(seconds=1)).expect_commands(CANCEL_HOTEL)
    assert _state(f).aborted == "trips.ChargeTrip: no reply after 1 attempt(s)"
    f.when(HotelCancelled(trip_id=TID)).expect_commands(CANCEL_FLIGHT)
    # The charge has no undo, so nothing about it is in doubt: the saga ends with its undos.
    f.when(FlightCancelled(trip_id=TID)).expect_ended("COMPENSATED").expect_no_deadlines()


def _to_failed_flight_cancel(f: SagaFixture) -> Result:
    _to_hotel(f)
    f.when(HotelUnavailable(trip_id=TID, reason="full")).expect_commands(CANCEL_FLIGHT)
    return f.when(FlightCancelFailed(trip_id=TID, reason="non-refundable"))


ASKED = "undo trips.CancelFlight failed: non-refundable"
ESCALATION = EscalateTrip(
    trip_id=TID,
    reason="compensation-failed",
    step="trips.CancelFlight",
    machine_state="COMPENSATING",
    detail=ASKED,
)


def test_a_failed_flight_cancel_asks_a_person_and_the_saga_waits() -> None:
    f = SagaFixture(trip_function)
    r = _to_failed_flight_cancel(f)
    r.expect_commands(ESCALATION).expect_active()
    assert r.waiting == ASKED
    state = _state(f)
    assert state.waiting_on() == ASKED
    assert state.waiting_kind() == "undo"
    # Nothing times a person out, not even the trip's ten minutes while it compensates.
    f.when_time_elapses(timedelta(hours=1)).expect_no_commands().expect_active()


def test_a_retry_decision_sends_the_flight_cancel_again() -> None:
    f = SagaFixture(trip_function)
    _to_failed_flight_cancel(f)
    f.when(TripDecided(trip_id=TID, decision="retry")).expect_commands(CANCEL_FLIGHT)
    assert _state(f).waiting_on() is None
    f.when(FlightCancelled(trip_id=TID)).expect_no_commands().expect_ended("COMPENSATED")
    assert _outcomes(f)[2:] == [
        ("undo", "trips.CancelFlight", "rejected"),
        ("send", "trips.EscalateTrip", "ok"),
        ("decision", "decision", "decided"),
        ("undo", "trips.CancelFlight", "ok"),
    ]


def test_an_operator_retry_resolves_the_failed_flight_cancel_too() -> None:
    f = SagaFixture(trip_function)
    _to_failed_flight_cancel(f)
    f.when_resolved("retry").expect_commands(CANCEL_FLIGHT)
    f.when(FlightCancelled(trip_id=TID)).expect_ended("COMPENSATED")


def test_compensate_is_no_answer_to_a_failed_flight_cancel() -> None:
    f = SagaFixture(trip_function)
    _to_failed_flight_cancel(f)
    with pytest.raises(AssertionError, match="the saga is already compensating"):
        f.when_resolved("compensate")
    # Said by a person's event, it is noted and the saga still waits for retry or skip.
    f.when(TripDecided(trip_id=TID, decision="compensate")).expect_no_commands()
    f.when(TripDecided(trip_id=TID, decision="later")).expect_no_commands()
    assert _state(f).waiting_on() == ASKED
    f.when(TripDecided(trip_id=TID, decision="skip")).expect_ended("COMPENSATED")


def test_a_skip_takes_the_failed_flight_cancel_as_undone_by_hand() -> None:
    f = SagaFixture(trip_function)
    _to_failed_flight_cancel(f)
    f.when_resolved("skip").expect_no_commands().expect_ended("COMPENSATED")
    assert _outcomes(f)[-1] == ("decision", "decision", "decided")
    assert _state(f).journal[-1].decision == "skip"


def test_a_skip_takes_the_failed_hotel_cancel_as_done_and_cancels_the_flight() -> None:
    f = SagaFixture(trip_function)
    _to_charge(f)
    f.when(ChargeDeclined(trip_id=TID, reason="card expired")).expect_commands(CANCEL_HOTEL)
    f.when(HotelCancelFailed(trip_id=TID, reason="front desk closed")).expect_commands(
        EscalateTrip(
            trip_id=TID,
            reason="compensation-failed",
            step="trips.CancelHotel",
            machine_state="COMPENSATING",
            detail="undo trips.CancelHotel failed: front desk closed",
        )
    )
    f.when_resolved("skip").expect_commands(CANCEL_FLIGHT)
    f.when(FlightCancelled(trip_id=TID)).expect_ended("COMPENSATED")
    decision = _state(f).journal[-2]
    assert (decision.kind, decision.decision) == ("decision", "skip")


def test_a_reply_delivered_again_has_no_second_effect() -> None:
    f = SagaFixture(trip_function)
    f.when(TRIP)
    first = f.when(FlightReserved(trip_id=TID)).expect_commands(RESERVE_HOTEL)
    journal = _state(f).journal
    # Published twice upstream (a new message id): it reaches the function, which awaits the
    # hotel now, and is noted, not applied.
    f.when(FlightReserved(trip_id=TID)).expect_no_commands().expect_active()
    assert _state(f).journal == journal
    assert _state(f).late == ["trips.FlightReserved ignored at await #1 (trips.ReserveHotel)"]
    # The same record again (a consumer restart): the processor drops it before the function.
    first.redeliver().expect_ignored().expect_no_commands()
    assert _state(f).journal == journal
    f.when(HotelReserved(trip_id=TID)).expect_commands(CHARGE)


def test_the_ten_minute_deadline_undoes_what_was_booked_and_times_the_trip_out() -> None:
    f = SagaFixture(trip_function)
    f.when(TRIP)
    f.when_time_elapses(timedelta(minutes=9, seconds=55))
    f.when(FlightReserved(trip_id=TID)).expect_commands(RESERVE_HOTEL)
    # The hotel's first attempt has 10 s, the trip 5 s left.
    f.when_time_elapses(timedelta(seconds=5)).expect_commands(CANCEL_FLIGHT)
    assert _state(f).aborted == "trips.ReserveHotel: the saga's deadline passed"
    f.when(FlightCancelled(trip_id=TID)).expect_no_commands().expect_active()
    # The hotel was given up mid-attempt: compensation listens for a late reservation.
    f.when_time_elapses(LATE_WINDOW - timedelta(seconds=1)).expect_active()
    f.when_time_elapses(timedelta(seconds=1)).expect_ended("TIMED_OUT").expect_no_deadlines()
    assert _outcomes(f) == [
        ("call", "trips.ReserveFlight", "ok"),
        ("call", "trips.ReserveHotel", "deadline"),
        ("undo", "trips.CancelFlight", "ok"),
        ("wait", "trips.HotelReserved", "timed-out"),
    ]


def test_a_flight_confirmed_after_the_deadline_is_cancelled_once() -> None:
    f = SagaFixture(trip_function)
    f.when(TRIP)
    # The airline has not answered in the trip's ten minutes: there is nothing to undo yet.
    f.when_time_elapses(timedelta(minutes=10)).expect_no_commands().expect_active()
    f.when(FlightReserved(trip_id=TID)).expect_commands(CANCEL_FLIGHT).expect_active()
    # The airline confirms twice: the seat is one seat, cancelled once.
    f.when(FlightReserved(trip_id=TID)).expect_no_commands()
    f.when(FlightCancelled(trip_id=TID)).expect_ended("TIMED_OUT")
    assert _outcomes(f) == [
        ("call", "trips.ReserveFlight", "deadline"),
        ("wait", "trips.FlightReserved", "ok"),
        ("undo", "trips.CancelFlight", "ok"),
    ]


def test_a_hotel_reserved_after_it_was_given_up_is_cancelled_once_while_the_trip_compensates() -> (
    None
):
    f = SagaFixture(trip_function)
    _to_hotel(f)
    f.when_time_elapses(timedelta(minutes=2)).expect_commands(
        RESERVE_HOTEL, RESERVE_HOTEL, RESERVE_HOTEL, CANCEL_FLIGHT
    )
    # The saga has moved on to undoing the flight when one of the hotel's attempts lands.
    f.when(HotelReserved(trip_id=TID)).expect_commands(CANCEL_HOTEL).expect_active()
    f.when(HotelReserved(trip_id=TID)).expect_no_commands()
    assert _state(f).late == [
        "late trips.HotelReserved for await #1: undo sent",
        "trips.HotelReserved ignored at await #2 (trips.CancelFlight)",
    ]
    f.when(FlightCancelled(trip_id=TID)).expect_no_commands()
    # Its compensation still listens out the hotel's window: it cannot know, on replay, that
    # the undo went out between two of its awaits.
    f.when_time_elapses(LATE_WINDOW).expect_no_commands().expect_ended("COMPENSATED")


def test_a_hotel_reserved_once_the_flight_is_cancelled_is_cancelled_before_the_trip_ends() -> None:
    f = SagaFixture(trip_function)
    _to_hotel(f)
    f.when_time_elapses(timedelta(minutes=2))
    f.when(FlightCancelled(trip_id=TID)).expect_no_commands().expect_active()
    f.when_time_elapses(LATE_WINDOW - timedelta(seconds=1))
    f.when(HotelReserved(trip_id=TID)).expect_commands(CANCEL_HOTEL)
    f.when(HotelReserved(trip_id=TID)).expect_no_commands()
    f.when(HotelCancelled(trip_id=TID)).expect_ended("COMPENSATED")
    assert _outcomes(f)[2:] == [
        ("undo", "trips.CancelFlight", "ok"),
        ("wait", "trips.HotelReserved", "ok"),
        ("undo", "trips.CancelHotel", "ok"),
    ]


def test_cancelling_mid_trip_undoes_the_hotel_then_the_flight() -> None:
    f = SagaFixture(trip_function)
    _to_charge(f)
    f.when_cancelled().expect_commands(CANCEL_HOTEL)
    assert _state(f).aborted == "trips.ChargeTrip: the saga was cancelled"
    f.when(HotelCancelled(trip_id=TID)).expect_commands(CANCEL_FLIGHT)
    f.when(FlightCancelled(trip_id=TID)).expect_ended("CANCELLED").expect_no_deadlines()
    assert _outcomes(f)[2] == ("call", "trips.ChargeTrip", "cancelled")


def test_terminating_ends_the_trip_as_it_stands_without_undoing_anything() -> None:
    f = SagaFixture(trip_function)
    _to_charge(f)
    f.when_terminated().expect_no_commands().expect_ended("TERMINATED").expect_no_deadlines()
    assert _state(f).pending is not None
    f.when(TripCharged(trip_id=TID)).expect_ignored()
