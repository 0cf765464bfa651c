"""The adapters of a service that owns one schema: a participant service, an outbox relay.

Such a service keeps the participant kit's inbox, outbox and positions in its own schema and
publishes that outbox with the processor's relay. :class:`ServiceAdapters` builds each adapter
it needs, configured as those services have always been.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

from processor._bootstrap.clients import relay_producer, saga_consumer
from processor._bootstrap.schemas import framed
from processor._engine.partitioner import Partitioner
from processor._kafka.client import SagaConsumer
from processor._kafka.producer import KafkaRecordProducer
from processor._postgres.connect import connect
from processor._postgres.held import Conn
from processor._postgres.notify import PostgresWakeSource
from processor._postgres.outbox import PostgresOutboxStore
from processor._postgres.participant import PostgresParticipantStore
from processor._postgres.schema.citus import Distributed
from processor._postgres.schema.participant import migrate_participant, migrate_service
from processor._postgres.schema.tables import Tables
from processor._runtime.assembly import relay_for
from processor._runtime.relay import Relay
from processor._runtime.schemas import SchemaResolver
from processor._wire import outbox_channel
from processor.settings import ConsumerSettings, RelaySettings

__all__ = ["ServiceAdapters"]


class ServiceAdapters:
    """Builds the adapters of a service over ``schema`` in its own database.

    Args:
        kafka: The librdkafka client configuration.
        partitioner: Places keyed records (the processor's ``SAGA_CONSUMER__PARTITIONER``).
        database_url: The service's own database.
        schema: The schema of the inbox, outbox and positions.
        application_name: Shown in ``pg_stat_activity``.
        search_path: Whether the loops' connections find the schema first, so that handlers
            name the service's tables without it.
        distributed: Whether the schema is made a Citus distributed schema
            (``SAGA_DATABASE__DISTRIBUTED``; see
            :data:`processor._postgres.schema.citus.Distributed`).
        buckets: With ``distributed="buckets"``, a new schema's bucket count
            (``SAGA_PARTICIPANT__BUCKETS``: the command topics' partition count).
    """

    def __init__(
        self,
        *,
        kafka: Mapping[str, str],
        partitioner: Partitioner,
        database_url: str,
        schema: str,
        application_name: str,
        search_path: bool,
        distributed: Distributed = "auto",
        buckets: int | None = None,
    ) -> None:
        self.kafka_config = dict(kafka)
        self.distributed: Distributed = distributed
        self.buckets = buckets
        self.partitioner = partitioner
        self.tables = Tables(schema)
        self._url = database_url
        self._app = application_name
        self._search_path = schema if search_path else None

    def connect(self) -> Conn:
        """A connection of the service's loops."""
        return connect(
            self._url,
            application_name=self._app,
            search_path=self._search_path,
            pin=self.tables.schema,
        )

    def migrate(self, migrations: Sequence[str] | None = None) -> int:
        """Creates or upgrades the kit's tables, then applies ``migrations`` (the service's own).

        Returns:
            How many of ``migrations`` were applied.
        """
        with connect(self._url, application_name=self._app) as conn:
            migrate_participant(
                conn,
                self.tables,
                self.distributed,
                buckets=self.buckets,
                partitioner=self.partitioner,
            )
            return migrate_service(conn, self.tables, migrations) if migrations is not None else 0

    def participant_store(self) -> PostgresParticipantStore:
        """The kit's inbox, outbox and positions."""
        return PostgresParticipantStore(self.connect, self.tables)

    def outbox_store(self) -> PostgresOutboxStore:
        """The schema's outbox, for the relay."""
        # No consumer group: the kit's outbox has no partition rows, every claim is global.
        return PostgresOutboxStore(self.connect, self.tables, anchor="inbox")

    def relay_producer(self, max_record_bytes: int) -> KafkaRecordProducer:
        """The relay's producer (see :func:`processor._bootstrap.clients.relay_producer`)."""
        return relay_producer(self.kafka_config, self.partitioner, max_record_bytes)

    def relay(self, settings: RelaySettings, wire: SchemaResolver | None = None) -> Relay:
        """The processor's relay over this schema's outbox; ``wire`` frames registry topics."""
        producer = framed(self.relay_producer(settings.max_record_bytes), wire)
        return relay_for(self.outbox_store(), producer, settings)

    def wake_source(self) -> PostgresWakeSource:
        """Notifications of the outbox's commits (the service's own included)."""
        return PostgresWakeSource(self.connect, outbox_channel(self.tables.schema))

    def consumers(self, settings: ConsumerSettings) -> partial[SagaConsumer]:
        """Makes the service's group members, given the group, topics and callbacks.

        :func:`~processor._bootstrap.clients.saga_consumer` over this Kafka config and
        ``settings``.
        """
        return partial(saga_consumer, self.kafka_config, settings)
