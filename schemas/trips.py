"""Messages of the trip saga (``sagas.trip``).

Services publish replies to ``trip-events`` and consume commands from ``trip-commands``; the
commands carry the ``deadline-unix-ms`` header, after which a service should not start the work.
Every message carries the ``trip_id`` correlation id. Each command names its ``step`` so a
service can apply it at most once, keyed by ``(trip_id, step)``. Requests for a person go to
``escalations``.
"""

from __future__ import annotations

from typing import Literal

from processor import Message, message_type
from schemas.orders import ESCALATIONS_TOPIC
from schemas.transfers import Amount

__all__ = [
    "TRIP_COMMANDS_TOPIC",
    "TRIP_EVENTS_TOPIC",
    "BookTrip",
    "CancelFlight",
    "CancelHotel",
    "ChargeDeclined",
    "ChargeTrip",
    "EscalateTrip",
    "FlightCancelFailed",
    "FlightCancelled",
    "FlightReserved",
    "FlightUnavailable",
    "HotelCancelFailed",
    "HotelCancelled",
    "HotelFailed",
    "HotelReserved",
    "HotelUnavailable",
    "ReserveFlight",
    "ReserveHotel",
    "TripCharged",
    "TripDecided",
    "TripRequested",
]

TRIP_EVENTS_TOPIC = "trip-events"
TRIP_COMMANDS_TOPIC = "trip-commands"


class _TripReply(Message):
    trip_id: str


class _TripRefusal(_TripReply):
    reason: str


@message_type("trips.BookTrip", topic=TRIP_EVENTS_TOPIC)
class BookTrip(Message):
    """A traveller asked for a flight and a hotel, paid together; starts the saga."""

    trip_id: str
    traveller_id: str
    flight: str
    hotel: str
    amount: Amount


@message_type("trips.ReserveFlight", topic=TRIP_COMMANDS_TOPIC)
class ReserveFlight(Message):
    """Hold a seat; answered by FlightReserved or FlightUnavailable."""

    trip_id: str
    flight: str
    step: Literal["flight"] = "flight"


@message_type("trips.FlightReserved", topic=TRIP_EVENTS_TOPIC)
class FlightReserved(_TripReply):
    """The seat is held for the traveller."""


@message_type("trips.FlightUnavailable", topic=TRIP_EVENTS_TOPIC)
class FlightUnavailable(_TripRefusal):
    """The flight is full; a business refusal, not worth retrying."""


@message_type("trips.CancelFlight", topic=TRIP_COMMANDS_TOPIC)
class CancelFlight(Message):
    """Undo of ReserveFlight; answered by FlightCancelled or FlightCancelFailed."""

    trip_id: str
    flight: str
    step: Literal["cancel-flight"] = "cancel-flight"


@message_type("trips.FlightCancelled", topic=TRIP_EVENTS_TOPIC)
class FlightCancelled(_TripReply):
    """The seat is released."""


@message_type("trips.FlightCancelFailed", topic=TRIP_EVENTS_TOPIC)
class FlightCancelFailed(_TripRefusal):
    """The airline refused the cancellation; a person must sort it out."""


@message_type("trips.ReserveHotel", topic=TRIP_COMMANDS_TOPIC)
class ReserveHotel(Message):
    """Hold a room; answered by HotelReserved, HotelUnavailable or HotelFailed."""

    trip_id: str
    hotel: str
    step: Literal["hotel"] = "hotel"


@message_type("trips.HotelReserved", topic=TRIP_EVENTS_TOPIC)
class HotelReserved(_TripReply):
    """The room is held for the traveller."""


@message_type("trips.HotelUnavailable", topic=TRIP_EVENTS_TOPIC)
class HotelUnavailable(_TripRefusal):
    """The hotel is full; a business refusal, not worth retrying."""


@message_type("trips.HotelFailed", topic=TRIP_EVENTS_TOPIC)
class HotelFailed(_TripRefusal):
    """The hotel's system could not answer (e.g. overloaded); worth retrying."""


@message_type("trips.CancelHotel", topic=TRIP_COMMANDS_TOPIC)
class CancelHotel(Message):
    """Undo of ReserveHotel; answered by HotelCancelled or HotelCancelFailed."""

    trip_id: str
    hotel: str
    step: Literal["cancel-hotel"] = "cancel-hotel"


@message_type("trips.HotelCancelled", topic=TRIP_EVENTS_TOPIC)
class HotelCancelled(_TripReply):
    """The room is released."""


@message_type("trips.HotelCancelFailed", topic=TRIP_EVENTS_TOPIC)
class HotelCancelFailed(_TripRefusal):
    """The hotel did not release the room (yet)."""


@message_type("trips.ChargeTrip", topic=TRIP_COMMANDS_TOPIC)
class ChargeTrip(Message):
    """Take the payment for the trip; answered by TripCharged or ChargeDeclined."""

    trip_id: str
    traveller_id: str
    amount: Amount
    step: Literal["charge"] = "charge"


@message_type("trips.TripCharged", topic=TRIP_EVENTS_TOPIC)
class TripCharged(_TripReply):
    """The money was taken."""


@message_type("trips.ChargeDeclined", topic=TRIP_EVENTS_TOPIC)
class ChargeDeclined(_TripRefusal):
    """The payment provider refused the charge."""


@message_type("trips.EscalateTrip", topic=ESCALATIONS_TOPIC)
class EscalateTrip(Message):
    """A person must act on the trip: a cancellation failed, or the trip ran out of time."""

    trip_id: str
    reason: str
    step: str | None
    machine_state: str
    detail: str


@message_type("trips.TripRequested", topic=TRIP_EVENTS_TOPIC)
class TripRequested(BookTrip):
    """The same booking, for the trip saga written as one function (``sagas.trip_function``)."""


@message_type("trips.TripDecided", topic=TRIP_EVENTS_TOPIC)
class TripDecided(Message):
    """A person decided on an escalated trip: ``retry`` the failed undo, or ``skip`` it as
    done by hand."""

    trip_id: str
    decision: str
    reason: str = ""
