"""The trip saga's participants on the participant kit: an airline, hotels and billing.

The demo runs the trip saga written as one function (``sagas.trip_function``). Each service
holds or cancels by trip in its own table, so a second command for the same trip (a saga's
retry, a relay's re-send) answers like the first. A flight named ``FULL ...`` has no seat, and
a traveller whose id starts with ``broke`` is declined at the charge: the first saga undoes
nothing, the second cancels its hotel, then its flight.
"""

from __future__ import annotations

from decimal import Decimal

import psycopg
from confluent_kafka import Producer

from demo.traffic import produce_event
from processor.participant import Replies, Sql, command_handler, participant
from processor.publish import with_client_logging as logged
from schemas.trips import (
    TRIP_COMMANDS_TOPIC,
    TRIP_EVENTS_TOPIC,
    CancelFlight,
    CancelHotel,
    ChargeDeclined,
    ChargeTrip,
    FlightCancelled,
    FlightReserved,
    FlightUnavailable,
    HotelCancelled,
    HotelReserved,
    ReserveFlight,
    ReserveHotel,
    TripCharged,
    TripRequested,
)

__all__ = [
    "TRIP_DDL",
    "TRIP_FUNCTION",
    "TRIP_TOPICS",
    "Airline",
    "Billing",
    "Hotels",
    "publish_trips",
    "trip_participants",
    "trip_plan",
    "trip_tally",
]

TRIP_DDL = """
CREATE TABLE IF NOT EXISTS flight_hold (
    trip_id   text PRIMARY KEY,
    flight    text NOT NULL,
    cancelled boolean NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS hotel_hold (
    trip_id   text PRIMARY KEY,
    hotel     text NOT NULL,
    cancelled boolean NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS trip_charge (trip_id text PRIMARY KEY, amount numeric(18,2) NOT NULL);
"""


@participant(name="airline")
class Airline:
    """Holds seats; a flight named FULL has none."""

    @command_handler()
    def reserve(self, command: ReserveFlight, replies: Replies, sql: Sql) -> None:
        if command.flight.startswith("FULL"):
            replies.send(FlightUnavailable(trip_id=command.trip_id, reason="no seat left"))
            return
        sql.execute(
            "INSERT INTO flight_hold VALUES (%s, %s, false) ON CONFLICT (trip_id) DO NOTHING",
            (command.trip_id, command.flight),
        )
        replies.send(FlightReserved(trip_id=command.trip_id))

    @command_handler()
    def cancel(self, command: CancelFlight, replies: Replies, sql: Sql) -> None:
        sql.execute(
            "UPDATE flight_hold SET cancelled = true WHERE trip_id = %s", (command.trip_id,)
        )
        replies.send(FlightCancelled(trip_id=command.trip_id))


@participant(name="hotels")
class Hotels:
    """Holds rooms."""

    @command_handler()
    def reserve(self, command: ReserveHotel, replies: Replies, sql: Sql) -> None:
        sql.execute(
            "INSERT INTO hotel_hold VALUES (%s, %s, false) ON CONFLICT (trip_id) DO NOTHING",
            (command.trip_id, command.hotel),
        )
        replies.send(HotelReserved(trip_id=command.trip_id))

    @command_handler()
    def cancel(self, command: CancelHotel, replies: Replies, sql: Sql) -> None:
        sql.execute("UPDATE hotel_hold SET cancelled = true WHERE trip_id = %s", (command.trip_id,))
        replies.send(HotelCancelled(trip_id=command.trip_id))


@participant(name="trip-billing")
class Billing:
    """Charges travellers; those whose id starts with ``broke`` are declined."""

    @command_handler()
    def charge(self, command: ChargeTrip, replies: Replies, sql: Sql) -> None:
        if command.traveller_id.startswith("broke"):
            replies.send(ChargeDeclined(trip_id=command.trip_id, reason="card declined"))
            return
        sql.execute(
            "INSERT INTO trip_charge VALUES (%s, %s) ON CONFLICT (trip_id) DO NOTHING",
            (command.trip_id, command.amount),
        )
        replies.send(TripCharged(trip_id=command.trip_id))


def trip_participants() -> list[object]:
    """One instance of each trip participant."""
    return [Airline(), Hotels(), Billing()]


TRIP_FUNCTION = "trip-function"
TRIP_TOPICS = (TRIP_EVENTS_TOPIC, TRIP_COMMANDS_TOPIC)


def trip_plan(stamp: str, n: int) -> tuple[TripRequested, ...]:
    """``n`` trips: most booked and charged; some with no seat, some declined at the charge."""
    trips = []
    for i in range(n):
        trips.append(
            TripRequested(
                trip_id=f"{stamp}-t{i}",
                traveller_id="broke-traveller" if i % 5 == 3 else f"traveller-{i % 4}",
                flight="FULL 404" if i % 7 == 5 else f"LH {100 + i}",
                hotel="Adlon",
                amount=Decimal("480.00"),
            )
        )
    return tuple(trips)


def publish_trips(kafka: str, prefix: str, trips: tuple[TripRequested, ...]) -> None:
    """Asks for every trip of the plan."""
    producer = Producer(logged({"bootstrap.servers": kafka, "enable.idempotence": True}))
    for trip in trips:
        produce_event(producer, prefix, trip, trip.trip_id, f"requested-{trip.trip_id}")
    if producer.flush(30):
        raise RuntimeError("trips not acknowledged by the broker")


def trip_tally(database: str, schema: str) -> dict[str, int]:
    """Ended trip sagas by outcome."""
    with psycopg.connect(database) as conn:
        rows = conn.execute(
            f'SELECT machine_state, count(*) FROM "{schema}".saga_instance '
            "WHERE saga_type = %s AND status = 'ended' GROUP BY 1 ORDER BY 1",
            (TRIP_FUNCTION,),
        ).fetchall()
    return {str(state): int(n) for state, n in rows}
