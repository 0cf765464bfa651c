"""Reads partitions' high watermarks from the broker, for the console's consumer lag."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, KafkaException, TopicPartition

from processor._kafka.logs import logged

__all__ = ["watermarks"]


def watermarks(
    config: Mapping[str, str], partitions: Iterable[tuple[str, int]], timeout: float = 3.0
) -> dict[tuple[str, int], tuple[int, int]] | None:
    """The (low, high) watermark of each partition; None when the broker does not answer.

    Args:
        config: librdkafka client configuration (bootstrap servers, security).
        partitions: (topic, partition) pairs, with any prefix applied.
        timeout: Seconds to wait for each partition's answer.
    """
    # A group id of its own that never joins or commits: librdkafka requires one for a consumer.
    # Its own log lines go through the processor's logging, at its levels (not to stderr).
    consumer = Consumer(
        logged({**config, "group.id": "saga-console-watermarks", "enable.auto.commit": False})
    )
    try:
        # Asked even when there is no partition to look up: an unreachable broker is "unknown",
        # not "no lag".
        consumer.list_topics(timeout=timeout)
        out: dict[tuple[str, int], tuple[int, int]] = {}
        for topic, partition in partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout, cached=False
            )
            out[(topic, partition)] = (int(low), int(high))
        return out
    except KafkaException:
        return None
    finally:
        consumer.close()
