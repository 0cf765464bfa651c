"""Partition counts and high watermarks asked of the cluster, for the growth watch.

A consumer that never joins its group: only its metadata and offset requests are used, from the
growth watch's own thread, so the saga consumer (one calling thread at a time) is never shared.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from processor._errors import Retryable
from processor._kafka.lazy import LazyConsumer
from processor._kafka.logs import client_logger

__all__ = ["KafkaTopicMetadata"]

log = logging.getLogger(__name__)


class KafkaTopicMetadata:
    """:class:`processor._ports.TopicMetadata` over a consumer that never subscribes.

    Args:
        config: librdkafka client configuration (bootstrap servers, security).
        group_id: A group id for the client (required by the client; never joined).
        timeout: Seconds each request may take.
    """

    def __init__(self, config: Mapping[str, str], group_id: str, timeout: float = 5.0) -> None:
        conf: dict[str, Any] = {
            **config,
            "group.id": group_id,
            "enable.auto.commit": False,
            "allow.auto.create.topics": False,
            "logger": client_logger(),
        }
        self._timeout = timeout
        self._client = LazyConsumer(conf)

    @property
    def _consumer(self) -> Consumer:
        return self._client.get()

    def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for topic in topics:
            try:
                meta = self._consumer.list_topics(topic, timeout=self._timeout)
            except KafkaException as e:
                raise Retryable(f"cannot read the metadata of {topic!r}: {e}") from e
            found = meta.topics.get(topic)
            if found is not None and found.error is None and found.partitions:
                out[topic] = len(found.partitions)
        return out

    def high_watermarks(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for p in partitions:
            try:
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=self._timeout, cached=False
                )
            except KafkaException as e:
                raise Retryable(f"cannot read the high watermark of {topic}/{p}: {e}") from e
            out[p] = int(high)
        return out

    def close(self) -> None:
        self._client.close()
