"""A service's outbox table, written in the service's own transactions.

For :class:`processor.publish.OutboxEventPublisher`: the participant kit's outbox in one schema,
created by the kit's migrations and published by a relay listening on the schema's channel.
"""

from __future__ import annotations

from collections.abc import Sequence

from processor._engine.records import OutboxRow
from processor._postgres.events import AnyConnection, insert_events
from processor._postgres.schema.participant import migrate_participant
from processor._postgres.schema.tables import Tables

__all__ = ["AnyConnection", "ServiceOutbox"]


class ServiceOutbox:
    """The outbox of ``schema``, on connections the caller holds.

    Args:
        schema: The schema holding the outbox (a participant service's ``schema``).
    """

    def __init__(self, schema: str) -> None:
        self.tables = Tables(schema)

    def migrate(self, conn: AnyConnection) -> None:
        """Creates the schema's outbox tables, if missing (the participant kit's migrations)."""
        migrate_participant(conn, self.tables)

    def insert(self, conn: AnyConnection, rows: Sequence[OutboxRow]) -> None:
        """Inserts ``rows`` within ``conn``'s current transaction; relays wake on its commit."""
        insert_events(conn, self.tables, list(rows))
