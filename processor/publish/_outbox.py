"""The transactional outbox publisher: events written in the service's own transaction.

:class:`OutboxEventPublisher` inserts each event's record into the service's outbox table (the
participant kit's), so an event goes out only once the caller's transaction commits; a relay
(:class:`~processor.publish._relay.OutboxRelay`, or a participant service's own) publishes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Unpack

from processor._authoring.definition import SagaState
from processor._authoring.messages import Message, MessageRegistry
from processor._authoring.messages import registry as default_registry
from processor._bootstrap.outbox import AnyConnection, ServiceOutbox
from processor._wire import HEADER_MESSAGE_ID
from processor.publish._records import EventRecordBuilder, PublishOptions

__all__ = ["OutboxEventPublisher"]


class OutboxEventPublisher:
    """Writes events to the service's outbox table, in the caller's own transaction.

    The table is the participant kit's outbox in ``schema`` (created by :meth:`migrate`), so a
    service that runs participants shares it with their replies, and their relay publishes
    both; otherwise run an :class:`OutboxRelay` on the schema. An event goes out only once the
    caller's transaction commits, at least once, with the headers :class:`EventPublisher`
    sets; rows of one key are published in order.

    Args:
        schema: The schema holding the outbox (the participant service's ``schema``).
        topic_prefix: Prefix of every topic on the broker (``SAGA_TOPIC_PREFIX``).
        sagas: Saga classes whose association properties key the events they handle.
        registry: Where the messages are registered.
    """

    def __init__(
        self,
        schema: str,
        *,
        topic_prefix: str = "",
        sagas: Iterable[type[SagaState]] = (),
        registry: MessageRegistry = default_registry,
    ) -> None:
        self._outbox = ServiceOutbox(schema)
        self.tables = self._outbox.tables
        self.records = EventRecordBuilder(topic_prefix=topic_prefix, sagas=sagas, registry=registry)

    def migrate(self, conn: AnyConnection) -> None:
        """Creates the schema's outbox tables, if missing (the participant kit's migrations)."""
        self._outbox.migrate(conn)

    def publish(
        self, conn: AnyConnection, message: Message, **options: Unpack[PublishOptions]
    ) -> str:
        """Inserts ``message`` into the outbox within ``conn``'s current transaction.

        Arguments as :meth:`EventPublisher.publish` (``options``: :class:`PublishOptions`); the
        trace context is the active span's when this is called.

        Returns:
            The message id.

        Raises:
            ValueError: As :meth:`EventPublisher.publish`, or ``conn`` is in autocommit mode
                outside a transaction block.
        """
        row = self.records.build(message, **options)
        self._outbox.insert(conn, [row])
        return row.headers[HEADER_MESSAGE_ID]
