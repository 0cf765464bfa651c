"""The demo's participants as one service: the order saga's (inventory, payment, fraud review,
shipping) and the trip saga's (airline, hotels, trip billing).

Run like any participant service, from the processor's ``SAGA_*`` variables::

    SAGA_DATABASE__URL=postgresql://... SAGA_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:19092 \\
    SAGA_PARTICIPANT__SCHEMA_NAME=demo_orders saga-processor participant run demo.participants:app

``DEMO_PARTICIPANTS=inventory,payment`` runs only those (one service per participant, in the
end-to-end tests). The services' tables are the app's migrations; :func:`seed` sets stock levels
and wallet balances.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from decimal import Decimal

import psycopg

import schemas  # noqa: F401 - registers the example message types
from demo.orders import DDL, order_participants, stock_up
from demo.trips import TRIP_DDL, trip_participants
from processor import ParticipantApp
from processor.participant import participant_of

__all__ = ["DEFAULTS", "SELECTION", "app", "seed"]

SELECTION = "DEMO_PARTICIPANTS"
"""Names the participants to run (comma-separated); all of them when unset."""

DEFAULTS = {
    "participant": {
        "schema_name": "demo_orders",
        "group_id": "order-participants",
        "application_name": "demo-order-participants",
    },
    "consumer": {"session_timeout": "6s"},
    "relay": {"poll_interval": "200ms"},
}


def app() -> ParticipantApp:
    """The participants named by ``DEMO_PARTICIPANTS`` (all when unset)."""
    only = [n for n in os.environ.get(SELECTION, "").split(",") if n]
    every = [*order_participants(), *trip_participants()]
    chosen = [p for p in every if not only or participant_of(type(p)).name in only]
    # One migration: the services have no deployed schema yet that the trips' tables must follow.
    return ParticipantApp(participants=chosen, migrations=[DDL + TRIP_DDL], settings=DEFAULTS)


def seed(
    database_url: str, schema: str, stock: Mapping[str, int], wallets: Mapping[str, Decimal]
) -> None:
    """Sets stock levels and wallet balances in a service schema that was migrated."""
    # The service's handlers name their tables without the schema: so does its seed.
    options = f"-c search_path={schema},public"
    with psycopg.connect(database_url, options=options) as conn, conn.transaction():
        stock_up(conn, stock, wallets)
