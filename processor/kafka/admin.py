"""What the preflight check reads of the cluster: topics' partition counts, recent record keys."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from processor.errors import RuntimeFailure
from processor.kafka.client import read_headers

__all__ = ["partition_counts", "sample_keys"]


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


def sample_keys(
    config: Mapping[str, str],
    topic: str,
    partitions: int,
    *,
    per_partition: int = 50,
    skip_types: frozenset[str] = frozenset(),
    timeout: float = 15.0,
) -> list[tuple[bytes, int]]:
    """The keys of up to ``per_partition`` of the latest keyed records of each partition.

    Reads without joining a group and commits nothing. Records whose ``message-type`` header is
    in ``skip_types`` are left out (records this project placed itself).

    Raises:
        RuntimeFailure: The cluster did not answer in time.
    """
    consumer = Consumer(
        {
            **config,
            "group.id": f"saga-check-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        starts = []
        for p in range(partitions):
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=timeout
                )
            except KafkaException as e:
                raise RuntimeFailure(f"cannot read the watermarks of {topic}/{p}: {e}") from e
            if high > low:
                starts.append(TopicPartition(topic, p, max(low, high - per_partition)))
        if not starts:
            return []
        consumer.assign(starts)
        waiting = {tp.partition for tp in starts}
        out: list[tuple[bytes, int]] = []
        ends = time.monotonic() + timeout
        while waiting and time.monotonic() < ends:
            for msg in consumer.consume(500, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        waiting.discard(msg.partition())
                    continue
                key = msg.key()
                if key is None:
                    continue
                try:
                    headers = dict(read_headers(msg) or ())
                except (SystemError, UnicodeDecodeError):
                    continue  # unreadable headers (see processor.kafka.client.to_record)
                kind = headers.get("message-type")
                if kind is not None and kind.decode(errors="replace") in skip_types:
                    continue
                partition = msg.partition()
                if partition is not None:
                    out.append((key, partition))
        return out
    finally:
        consumer.close()
