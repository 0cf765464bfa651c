"""A trip as orchestrated steps: reserve a flight, then a hotel, then charge the traveller.

- flight: the airline may take its time to confirm; the trip's deadline bounds the wait, and a
  confirmation landing after it is cancelled. Undone by a cancellation, retried; one that keeps
  failing goes to a person, and the saga waits for their decision (``saga resolve``).
- hotel: ten seconds per attempt, retried three times (the hotel dedupes by trip and step).
- charge: thirty seconds to answer. A decline or a timeout cancels the hotel, then the flight.

The whole trip has ten minutes; when they run out it is TIMED_OUT and undoes what it booked.
Written the short way: each step names its replies, the saga names its association property
once, and the start event is kept on the state (``trip``) by the generated start handler.
"""

from __future__ import annotations

from datetime import timedelta

from processor import (
    OrchestratedSaga,
    Orchestration,
    Replies,
    RetryPolicy,
    Step,
    saga,
    start_event,
)
from schemas import trips

__all__ = ["TRIP_ORCHESTRATION", "TripSaga"]

TRIP_ORCHESTRATION = Orchestration["TripSaga"](
    start=trips.BookTrip,
    steps=(
        Step(
            "flight",
            action=lambda s: trips.ReserveFlight(trip_id=s.trip.trip_id, flight=s.trip.flight),
            compensation=lambda s: trips.CancelFlight(trip_id=s.trip.trip_id, flight=s.trip.flight),
            timeout=timedelta(minutes=15),
            late_success="undo",
            replies=Replies(
                succeeded=trips.FlightReserved,
                rejected=trips.FlightUnavailable,
                undone=trips.FlightCancelled,
                undo_failed=trips.FlightCancelFailed,
            ),
        ),
        Step(
            "hotel",
            action=lambda s: trips.ReserveHotel(trip_id=s.trip.trip_id, hotel=s.trip.hotel),
            compensation=lambda s: trips.CancelHotel(trip_id=s.trip.trip_id, hotel=s.trip.hotel),
            timeout=timedelta(seconds=10),
            idempotent=True,
            retry=RetryPolicy(max_attempts=4, base_delay=timedelta(seconds=2)),
            replies=Replies(
                succeeded=trips.HotelReserved,
                rejected=trips.HotelUnavailable,
                failed=trips.HotelFailed,
                undone=trips.HotelCancelled,
                undo_failed=trips.HotelCancelFailed,
            ),
        ),
        Step(
            "charge",
            action=lambda s: trips.ChargeTrip(
                trip_id=s.trip.trip_id, traveller_id=s.trip.traveller_id, amount=s.trip.amount
            ),
            timeout=timedelta(seconds=30),
            replies=Replies(succeeded=trips.TripCharged, rejected=trips.ChargeDeclined),
        ),
    ),
    escalation=lambda s, e: trips.EscalateTrip(trip_id=s.trip.trip_id, **e.model_dump()),
    sla=timedelta(minutes=10),
)


@saga(type="trip-saga", association_property="trip_id")
class TripSaga(OrchestratedSaga):
    """Books a flight and a hotel and charges for both, or undoes what it booked."""

    orchestration = TRIP_ORCHESTRATION

    trip: trips.BookTrip = start_event()
