"""The processor's adapters, each built from its settings in one place.

:class:`Adapters` is the composition root of a processor process and of every operator tool
(the CLI, the console): it names the PostgreSQL and Kafka adapters and chooses how each is
configured (connection options, application names, idle-in-transaction limits, producer
overrides, notification channels). The runtime sees it only as
:class:`processor._ports.AdapterFactory`.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta

from processor._bootstrap.clients import record_producer, relay_producer, saga_consumer
from processor._kafka import admin
from processor._kafka.client import SagaConsumer
from processor._kafka.metadata import KafkaTopicMetadata
from processor._kafka.producer import KafkaRecordProducer
from processor._kafka.watermarks import watermarks
from processor._ports.cluster import ClusterView, TopicFound, TopicPlan
from processor._ports.consumer import TP
from processor._postgres.batch.handle import PostgresBatchStore
from processor._postgres.colocation import Colocation
from processor._postgres.connect import connect
from processor._postgres.connect import ensure_schema as migrate_to_latest
from processor._postgres.deadlines import PostgresDeadlineStore
from processor._postgres.failed_outbox import PostgresFailedOutbox
from processor._postgres.growth import PostgresGrowthStore, current_router
from processor._postgres.held import Conn
from processor._postgres.notify import PostgresWakeSource
from processor._postgres.outbox import PostgresOutboxStore
from processor._postgres.reads import cluster
from processor._postgres.reads.check import PostgresCheckSource
from processor._postgres.reads.gauges import PostgresGauges
from processor._postgres.reads.inspect import InspectQueries, open_inspect_queries
from processor._postgres.reads.operator import OperatorQueries, open_operator_queries
from processor._postgres.retention import PostgresRetentionStore
from processor._postgres.schema.citus import (
    PinnedNode,
    local_node,
    pinned_node,
    use_citus,
    will_distribute,
)
from processor._postgres.schema.citus_move import NodeMove, move_pin
from processor._postgres.schema.tables import MIGRATIONS, Tables, current_version, pending_sql
from processor._postgres.tls import warn_unverified_tls
from processor._wire import outbox_channel
from processor.settings import ProcessorSettings

# The query objects are named for the operator tools' annotations; they hold more queries than
# the ports the operator services take.
__all__ = ["Adapters", "InspectQueries", "OperatorQueries", "instance_id_for", "tables_for"]


def tables_for(settings: ProcessorSettings) -> Tables:
    """The processor's table names, as its settings configure them."""
    return Tables(
        schema=settings.database.schema_name,
        deadline=settings.deadline.table,
        deadline_lock=settings.deadline.lock_table,
    )


def instance_id_for(settings: ProcessorSettings) -> str:
    """This replica's name: ``SAGA_INSTANCE_ID``, else one unique to this process."""
    return settings.instance_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Adapters:
    """Builds every adapter a processor or an operator tool uses, from the processor's settings.

    Nothing connects until a method is called; each call makes a new adapter.

    Args:
        settings: The processor's settings.
        instance_id: The replica's name (its connections' ``application_name`` is
            ``saga:<instance_id>``); by default :func:`instance_id_for` the settings.
    """

    def __init__(self, settings: ProcessorSettings, instance_id: str | None = None) -> None:
        self.settings = settings
        self.tables = tables_for(settings)
        self._instance_id = instance_id or instance_id_for(settings)
        # Where each partition's bucket lives (tables distributed by bucket), shared by the
        # batch stores, which keep it current, and the consumer's intake, which reads it.
        self.colocation = Colocation()
        self._url = settings.database.url.get_secret_value()
        self.kafka_config = settings.kafka.client_config()
        cs = settings.consumer
        # Once this replica's partitions go to another (its session timed out while frozen, or
        # it gave them back because the database stopped answering it), the heir must be able
        # to claim them: the server ends a transaction left idle that long and frees its locks.
        self._idle_limit = min(cs.session_timeout, cs.unavailable_timeout)

    @property
    def instance_id(self) -> str:
        """The replica's name."""
        return self._instance_id

    @property
    def schema_version(self) -> int:
        """The schema version this code migrates the database to."""
        return len(MIGRATIONS)

    # -- the processor's loops -------------------------------------------------------------

    def connect(
        self, idle_in_transaction_timeout: timedelta | None = None, *, keyed: bool = False
    ) -> Conn:
        """A connection of the replica's loops: named after it, every statement bounded.

        On Citus, through the schema's node (:func:`processor._postgres.schema.citus.pin_node`).
        """
        return connect(
            self._url,
            pin=self.tables.schema,
            application_name=f"saga:{self._instance_id}",
            idle_in_transaction_timeout=idle_in_transaction_timeout,
            statement_timeout=self.settings.database.statement_timeout,
            keyed=keyed,
        )

    def check_transport(self) -> None:
        """Warns when the database connection is encrypted but its server is not verified."""
        warn_unverified_tls(self._url)

    def _migrate_to_latest(self, *, move: bool = False) -> int:
        db = self.settings.database
        return migrate_to_latest(
            self._url,
            self.tables,
            db.distributed,
            buckets=db.buckets,
            partitioner=self.settings.consumer.partitioner,
            move=move,
        )

    def ensure_schema(self) -> int:
        """Creates or upgrades the processor's tables at start; returns the schema version."""
        return self._migrate_to_latest()

    def batch_store(self) -> PostgresBatchStore:
        """A store for the consumer loop's batches, on a keyed connection of its own."""
        # Keyed: a batch only reads and writes the rows of its own sagas and partitions.
        return PostgresBatchStore(
            lambda: self.connect(self._idle_limit, keyed=True),
            self.tables,
            self.settings.consumer.group_id,
            wake_within=self.settings.deadline.polling.interval,
            origin=self._instance_id,
            colocation=self.colocation,
            # The bound the server puts on a session idle in its transaction, for one frozen
            # mid-statement, which the server never ends (processor/_postgres/stuck.py).
            stuck_after=self._idle_limit,
        )

    def growth_store(self) -> PostgresGrowthStore:
        """The growth watch's recorded partition counts."""
        return PostgresGrowthStore(lambda: self.connect(self._idle_limit), self.tables)

    def topic_metadata(self) -> KafkaTopicMetadata:
        """The broker's partition counts and high watermarks, for the growth watch."""
        return KafkaTopicMetadata(self.kafka_config, f"{self.settings.consumer.group_id}.metadata")

    def outbox_store(self) -> PostgresOutboxStore:
        """The relay's outbox, partitioned by the consumer group's owner epochs."""
        flush_timeout = self.settings.relay.flush_timeout
        return PostgresOutboxStore(
            # A frozen relay must not keep the relay lock (rows of no partition) or its
            # partitions' offsets rows (their hand-over) for as long as it stays frozen; a live
            # round idles at most one flush.
            lambda: self.connect(2 * flush_timeout),
            self.tables,
            self.settings.consumer.group_id,
        )

    def relay_producer(self) -> KafkaRecordProducer:
        """The relay's producer (see :func:`processor._bootstrap.clients.relay_producer`)."""
        return relay_producer(
            self.kafka_config,
            self.settings.consumer.partitioner,
            self.settings.relay.max_record_bytes,
        )

    def wake_source(self) -> PostgresWakeSource:
        """Notifications of outbox commits; this replica's own are skipped."""
        return PostgresWakeSource(
            self.connect, outbox_channel(self.tables.schema), ignore=self._instance_id
        )

    def deadline_store(self) -> PostgresDeadlineStore:
        """The deadline poller's table and lease."""
        # A frozen leader must not keep what its open transaction holds: its claims' row locks,
        # and on tables distributed by bucket the lease table's shard lock (a claim reads the
        # lease, a Citus reference table), which would keep the next leader from taking over.
        return PostgresDeadlineStore(lambda: self.connect(self._idle_limit), self.tables)

    def record_producer(self) -> KafkaRecordProducer:
        """A producer for fired deadlines and operator records."""
        return record_producer(self.kafka_config, self.settings.consumer.partitioner)

    def retention_store(self) -> PostgresRetentionStore:
        """What retention purges."""
        # A frozen replica must not keep the retention lock (or its row locks) for long.
        return PostgresRetentionStore(lambda: self.connect(self._idle_limit), self.tables)

    def consumer(
        self,
        topics: Sequence[str],
        on_assign: Callable[[list[TP]], Mapping[TP, int | None]],
        on_revoke: Callable[[list[TP]], None],
    ) -> SagaConsumer:
        """The group member consuming ``topics``; its positions come from ``on_assign``."""
        cs = self.settings.consumer
        return saga_consumer(self.kafka_config, cs, cs.group_id, topics, on_assign, on_revoke)

    def gauges(self) -> PostgresGauges:
        """A reader of the processor's tables for the metrics sampler."""
        return PostgresGauges(
            self.connect, self.tables, self.settings.consumer.group_id, self._instance_id
        )

    def resume_store(self) -> OperatorQueries:
        """The parked sagas' store on an autocommit connection of its own (a context manager)."""
        return self.operator_queries()

    # -- operator tools --------------------------------------------------------------------

    def operator_queries(self) -> OperatorQueries:
        """Operator queries on an autocommit connection of their own (a context manager)."""
        return open_operator_queries(self._url, self.tables)

    def inspect_queries(self) -> InspectQueries:
        """Inspect queries on an autocommit connection of their own (a context manager)."""
        return open_inspect_queries(self._url, self.tables)

    @contextmanager
    def failed_outbox(self) -> Iterator[PostgresFailedOutbox]:
        """The failed outbox on an autocommit connection of its own, closed on leaving."""
        with connect(self._url, pin=self.tables.schema, autocommit=True) as conn:
            yield PostgresFailedOutbox(conn, self.tables)

    @contextmanager
    def check_source(self) -> Iterator[PostgresCheckSource]:
        """What the preflight check reads, on an autocommit connection of its own."""
        with connect(self._url, application_name="saga-processor-check", autocommit=True) as conn:
            yield PostgresCheckSource(conn, self.tables)

    def router(self) -> Callable[[str, bytes, int], int]:
        """Routes operator records to where a saga's events go now (input topics may grow)."""
        cs = self.settings.consumer
        return current_router(lambda: connect(self._url), self.tables, cs.group_id, cs.partitioner)

    def migrate(self) -> int:
        """Creates or upgrades the processor's tables; returns the schema version.

        An operator's command (`saga-processor migrate`): it may distribute tables that already
        hold rows by bucket, which a replica's start refuses (see `bucket_tables`).
        """
        return self._migrate_to_latest(move=True)

    def pending_migrations(self) -> tuple[int, str]:
        """The live schema's version and the DDL that would bring it to :attr:`schema_version`."""
        setting = self.settings.database.distributed
        with connect(self._url, application_name="saga-processor-migrate", autocommit=True) as c:
            current = current_version(c, self.tables)
            citus = use_citus(c, setting)
            distribute = citus and will_distribute(c, self.tables.schema, move=setting == "citus")
        return current, pending_sql(current, self.tables, distribute=distribute)

    def citus_node(self) -> tuple[tuple[int, str] | None, PinnedNode | None]:
        """The Citus node the database URL reaches, and the one the schema's processes use."""
        with connect(self._url, application_name="saga-processor-check", autocommit=True) as c:
            return local_node(c), pinned_node(c, self.tables.schema)

    def move_citus_node(self, actor: str, reason: str | None = None) -> NodeMove:
        """Makes the node the database URL reaches the schema's (see :func:`move_pin`)."""
        with connect(self._url, application_name="saga-processor-ops", autocommit=True) as c:
            lease = self.tables.q(self.tables.deadline_lock)
            return move_pin(c, self.tables.schema, actor, reason, lease_table=lease)

    def cluster_view(self) -> ClusterView:
        """Replicas, partitions and owners, the deadline lease and the relay's backlog."""
        with connect(self._url, application_name="saga-processor-console", autocommit=True) as c:
            return cluster.cluster_view(c, self.tables, self.settings.consumer.group_id)

    def database_answers(self) -> bool:
        """Whether the database takes a connection and answers a query."""
        return cluster.database_answers(self._url)

    def watermarks(
        self, partitions: Iterable[TP], timeout: float
    ) -> dict[TP, tuple[int, int]] | None:
        """The (low, high) watermark of each partition; None when the broker does not answer."""
        return watermarks(self.kafka_config, partitions, timeout)

    # -- topics ----------------------------------------------------------------------------
    # Through the module: a test may bound the admin client's waits.

    def partition_counts(self, topics: Iterable[str]) -> dict[str, int | None]:
        """The partition count of each topic; None for a topic the cluster lacks."""
        return admin.partition_counts(self.kafka_config, topics)

    def sample_keys(
        self, topic: str, partitions: int, skip_types: frozenset[str]
    ) -> list[tuple[bytes, int]]:
        """The keys of the latest keyed records of each partition (not ``skip_types``)."""
        return admin.sample_keys(self.kafka_config, topic, partitions, skip_types=skip_types)

    def create_topics(self, plans: Iterable[TopicPlan]) -> dict[str, str]:
        """Creates the planned topics the cluster lacks; ``created`` or ``exists`` by name."""
        return admin.create_topics(self.kafka_config, plans)

    def describe_topics(self, topics: Iterable[str]) -> dict[str, TopicFound | None]:
        """What the cluster has of each topic; None for one it lacks."""
        return admin.describe_topics(self.kafka_config, topics)
