"""What a running processor asks of its composition root: every store, client and source it uses.

:class:`processor._runtime.processor.Processor` builds its loops from an :class:`AdapterFactory`
and names no adapter; ``processor._bootstrap`` implements it over PostgreSQL and Kafka from the
processor's settings. Each method returns a new object, configured (connection options,
producer settings, channels) as that loop needs it, so the runtime never chooses them. Adapters
only: what the runtime does with them is the runtime's (a method that handed back a function of
a higher layer would let the runtime run it past the layer test, which
``tests/unit/test_purity.py`` checks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from processor._ports.cluster import DatabaseSample
from processor._ports.consumer import (
    TP,
    BatchStore,
    GrowthStore,
    RecordConsumer,
    RecordProducer,
    RetentionStore,
    TopicMetadata,
    WakeSource,
)
from processor._ports.deadlines import DeadlineStore
from processor._ports.operator import ResumeStore
from processor._ports.outbox import OutboxStore

__all__ = ["AdapterFactory", "DatabaseGauges"]


class DatabaseGauges(Protocol):
    """Reads the processor's tables for the metrics sampler, on a connection of its own."""

    def sample(self) -> DatabaseSample:
        """One reading; raises a runtime failure when the database does not answer."""
        ...

    def close(self) -> None: ...


class AdapterFactory(Protocol):
    """Builds the adapters of one replica.

    Attributes:
        instance_id: This replica's name: the owner in the offsets table, the deadline lease's
            holder, the payload its own notifications carry.
        schema_version: The schema version this code migrates the database to.
    """

    @property
    def instance_id(self) -> str: ...

    @property
    def schema_version(self) -> int: ...

    def check_transport(self) -> None:
        """Warns when the database connection is encrypted but its server is not verified."""
        ...

    def ensure_schema(self) -> int:
        """Creates or upgrades the processor's tables; returns the schema version."""
        ...

    def batch_store(self) -> BatchStore:
        """A store for the consumer loop's batches (one per lane: each holds a connection)."""
        ...

    def growth_store(self) -> GrowthStore:
        """The growth watch's recorded partition counts."""
        ...

    def topic_metadata(self) -> TopicMetadata:
        """The broker's partition counts and high watermarks, for the growth watch."""
        ...

    def outbox_store(self) -> OutboxStore:
        """The relay's outbox, partitioned by the consumer group's owner epochs."""
        ...

    def relay_producer(self) -> RecordProducer:
        """The relay's producer: it sets refused records aside itself (no gap-less guarantee)."""
        ...

    def wake_source(self) -> WakeSource:
        """Notifications of outbox commits by other replicas (this one's own are skipped)."""
        ...

    def deadline_store(self) -> DeadlineStore:
        """The deadline poller's table and lease."""
        ...

    def record_producer(self) -> RecordProducer:
        """A producer for fired deadlines."""
        ...

    def retention_store(self) -> RetentionStore:
        """What retention purges."""
        ...

    def consumer(
        self,
        topics: Sequence[str],
        on_assign: Callable[[list[TP]], Mapping[TP, int | None]],
        on_revoke: Callable[[list[TP]], None],
    ) -> RecordConsumer:
        """The group member consuming ``topics``, its positions read by ``on_assign``."""
        ...

    def gauges(self) -> DatabaseGauges:
        """A reader of the processor's tables for the metrics sampler."""
        ...

    def resume_store(self) -> AbstractContextManager[ResumeStore]:
        """The parked sagas and their held records, on a connection of its own (closed on leaving).

        The runtime resumes those parked on a version newer than their code knew over it.
        """
        ...
