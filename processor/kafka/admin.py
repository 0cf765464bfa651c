"""Reads topic metadata (which topics exist, with how many partitions) for the preflight check."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from processor.errors import RuntimeFailure

__all__ = ["partition_counts"]


def partition_counts(
    config: Mapping[str, str], topics: Iterable[str], timeout: float = 15.0
) -> dict[str, int | None]:
    """The partition count of each topic, None for a topic the cluster does not have.

    Args:
        config: librdkafka client configuration (bootstrap servers, security).
        topics: Topic names, with any prefix applied.
        timeout: Seconds to wait for the cluster's metadata.

    Raises:
        RuntimeFailure: The cluster did not answer in time.
    """
    admin = AdminClient(dict(config))
    try:
        meta = admin.list_topics(timeout=timeout)
    except KafkaException as e:
        raise RuntimeFailure(f"cannot read topic metadata: {e}") from e
    out: dict[str, int | None] = {}
    for topic in topics:
        found = meta.topics.get(topic)
        out[topic] = None if found is None or found.error is not None else len(found.partitions)
    return out
