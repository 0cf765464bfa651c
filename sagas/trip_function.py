"""The trip of ``sagas/trip.py`` written as one function: the same steps, timeouts and undos."""

from datetime import timedelta

from processor import RetryPolicy, SagaContext, Undo, saga_function
from schemas import trips as t


@saga_function(
    type="trip-function",
    association_property="trip_id",
    sla=timedelta(minutes=10),
    escalation=lambda trip, e: t.EscalateTrip(trip_id=trip.trip_id, **e.model_dump()),
    decisions=t.TripDecided,
)
async def trip_function(saga: SagaContext, trip: t.TripRequested) -> None:
    """Books a flight and a hotel and charges for both, or undoes what it booked."""
    f = {"trip_id": trip.trip_id, "flight": trip.flight}
    h = {"trip_id": trip.trip_id, "hotel": trip.hotel}
    await saga.call(
        t.ReserveFlight(**f),
        expects=t.FlightReserved,
        rejects=t.FlightUnavailable,
        timeout=timedelta(minutes=15),
        undo=Undo(t.CancelFlight(**f), expects=t.FlightCancelled, rejects=t.FlightCancelFailed),
    )
    await saga.call(
        t.ReserveHotel(**h),
        expects=t.HotelReserved,
        rejects=t.HotelUnavailable,
        retry_on=t.HotelFailed,
        timeout=timedelta(seconds=10),
        retry=RetryPolicy(max_attempts=4, base_delay=timedelta(seconds=2)),
        undo=Undo(t.CancelHotel(**h), expects=t.HotelCancelled, rejects=t.HotelCancelFailed),
    )
    charge = t.ChargeTrip(trip_id=trip.trip_id, traveller_id=trip.traveller_id, amount=trip.amount)
    await saga.call(
        charge, expects=t.TripCharged, rejects=t.ChargeDeclined, timeout=timedelta(seconds=30)
    )
