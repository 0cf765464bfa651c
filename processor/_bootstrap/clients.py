"""The Kafka clients every process makes, built in one place from a client config.

The producers differ only in their overrides of :func:`processor._kafka.producer.make_producer`:
the relay sets refused records aside itself, the event publisher reports every delivery.
:func:`logged` routes a client's own log lines through Python logging, for clients a service
makes itself (:mod:`processor.publish` offers it). Only
the Kafka client is imported here, so a publisher needs no database driver.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from processor._engine.partitioner import Partitioner
from processor._kafka.client import SagaConsumer
from processor._kafka.logs import logged
from processor._kafka.producer import KafkaRecordProducer, make_producer, relay_overrides
from processor._kafka.tracked import FailedDelivery, TrackedProducer
from processor._ports.consumer import TP
from processor.settings import ConsumerSettings

__all__ = [
    "FailedDelivery",
    "TrackedProducer",
    "logged",
    "record_producer",
    "relay_producer",
    "saga_consumer",
    "tracked_producer",
]


def record_producer(config: Mapping[str, str], partitioner: Partitioner) -> KafkaRecordProducer:
    """A producer of whole batches (fired deadlines, operator records), made on first send."""
    return KafkaRecordProducer(lambda: make_producer(config, partitioner=partitioner))


def relay_producer(
    config: Mapping[str, str], partitioner: Partitioner, max_record_bytes: int
) -> KafkaRecordProducer:
    """The outbox relay's producer: no gap-less guarantee, records up to ``max_record_bytes``."""
    return KafkaRecordProducer(
        lambda: make_producer(config, partitioner=partitioner, **relay_overrides(max_record_bytes))
    )


def tracked_producer(
    config: Mapping[str, str], partitioner: Partitioner, overrides: Mapping[str, Any]
) -> TrackedProducer:
    """A producer that tracks each record it was given until the broker acknowledges it."""
    return TrackedProducer(lambda: make_producer(config, partitioner=partitioner, **overrides))


def saga_consumer(
    config: Mapping[str, str],
    settings: ConsumerSettings,
    group_id: str,
    topics: Sequence[str],
    on_assign: Callable[[list[TP]], Mapping[TP, int | None]],
    on_revoke: Callable[[list[TP]], None],
    **options: int,
) -> SagaConsumer:
    """A group member consuming ``topics``, its timeouts and batch bytes from ``settings``.

    Its metadata is refreshed every ``growth_check_interval`` (librdkafka's default is five
    minutes), so a processor's and a participant service's consumers alike see partitions
    added to their topics within seconds. A participant consumer on the five-minute default
    was seen to stay out of its group for minutes after a broker restart, until its next
    refresh, while the processors' consumers rejoined at once.

    ``options`` are further keyword arguments of :class:`processor._kafka.client.SagaConsumer`.
    """
    options.setdefault(
        "metadata_refresh_ms", max(1000, int(settings.growth_check_interval.total_seconds() * 1000))
    )
    return SagaConsumer(
        config,
        group_id=group_id,
        topics=topics,
        on_assign=on_assign,
        on_revoke=on_revoke,
        session_timeout_ms=int(settings.session_timeout.total_seconds() * 1000),
        max_poll_interval_ms=int(settings.max_poll_interval.total_seconds() * 1000),
        max_batch_bytes=settings.max_batch_bytes,
        **options,
    )
