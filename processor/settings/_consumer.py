"""The consumer settings: the group, its batches, bad records, failing handlers, partitioning."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field

from processor._engine.partitioner import Partitioner, normalise
from processor.settings._values import Duration

__all__ = ["ConsumerSettings"]


def _partitioner(value: Any) -> Any:
    return normalise(value) if isinstance(value, str) else value


class ConsumerSettings(BaseModel):
    """The consumer group, its batches, and how bad records and failing handlers are treated."""

    group_id: str = "saga-processor"
    topics: list[str] = Field(default_factory=list)
    batch_size: int = Field(default=500, ge=1)
    # How long one consume() call may wait to fill a batch; bounds latency at low load.
    batch_timeout: Duration = timedelta(milliseconds=100)
    max_record_bytes: int = Field(default=1_048_576, ge=1)
    handler_attempts: int = Field(default=3, ge=1)
    dead_letter_topic: str = "saga-dead-letters"
    # A batch also ends at about this many bytes of keys and values; the client's fetch and
    # prefetch queue are sized from it, so memory stays bounded however large records are.
    max_batch_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    session_timeout: Duration = timedelta(seconds=45)
    max_poll_interval: Duration = timedelta(minutes=5)
    # How long the database may fail or not answer before this replica gives its partitions
    # back to the group (to replicas that can reach it); it rejoins once the database answers.
    unavailable_timeout: Duration = timedelta(seconds=20)
    # How often sagas parked because something was newer than the code that parked them (an
    # event's schema version, a stored state's version: a rollout, a rolling deploy) are retried
    # by a replica whose code knows it; also once at start.
    resume_interval: Duration = timedelta(seconds=30)
    # The partitioner the producers of the input topics key saga ids with: crc32 (librdkafka's
    # default consistent_random: the Python, Go, .NET and C clients) or murmur2 (the Java
    # clients' default, librdkafka's murmur2_random). Every producer this project makes uses it
    # (relay, participant replies, deadline poller, operator records), deadlines of sagas that
    # moved when a topic grew are fired where it sends them, and records whose key it would
    # send elsewhere are counted and logged. librdkafka's names are accepted too.
    partitioner: Annotated[Partitioner, BeforeValidator(_partitioner)] = "crc32"
    # How often the input topics' partition counts are read (and the consumer's metadata
    # refreshed), so that a growth is noticed within this.
    growth_check_interval: Duration = timedelta(seconds=5)
