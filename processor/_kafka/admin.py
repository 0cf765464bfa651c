"""The cluster as `check` and `topics` see it, and the topics `topics create` makes.

Read: topics' partition counts and configs, recent record keys.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic  # type: ignore[attr-defined]

from processor._errors import RuntimeFailure
from processor._kafka.client import read_headers
from processor._kafka.logs import client_logger, logged
from processor._ports.cluster import TopicFound, TopicPlan
from processor._wire import HEADER_MESSAGE_TYPE

__all__ = ["create_topics", "describe_topics", "partition_counts", "sample_keys"]

# The topic configs `topics check` compares.
_CHECKED_CONFIGS = ("cleanup.policy", "max.message.bytes")


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
    admin = AdminClient(logged(config))
    try:
        meta = admin.list_topics(timeout=timeout)
    except KafkaException as e:
        raise RuntimeFailure(f"cannot read topic metadata: {e}") from e
    out: dict[str, int | None] = {}
    for topic in topics:
        found = meta.topics.get(topic)
        out[topic] = None if found is None or found.error is not None else len(found.partitions)
    return out


def describe_topics(
    config: Mapping[str, str], topics: Iterable[str], timeout: float = 15.0
) -> dict[str, TopicFound | None]:
    """Each topic's partition count and the configs `topics check` compares; None if missing.

    Raises:
        RuntimeFailure: The cluster did not answer in time.
    """
    names = list(topics)
    counts = partition_counts(config, names, timeout)
    present = [t for t in names if counts.get(t) is not None]
    out: dict[str, TopicFound | None] = dict.fromkeys(names)
    if not present:
        return out
    admin = AdminClient(logged(config))
    futures = admin.describe_configs(
        [ConfigResource(ConfigResource.Type.TOPIC, t) for t in present], request_timeout=timeout
    )
    for resource, future in futures.items():
        try:
            entries = future.result(timeout)
        except KafkaException as e:
            raise RuntimeFailure(f"cannot read the configs of topic {resource.name}: {e}") from e
        count = counts[resource.name]
        assert count is not None
        configs = {k: str(v.value) for k, v in entries.items() if k in _CHECKED_CONFIGS}
        out[resource.name] = TopicFound(count, configs)
    return out


def create_topics(
    config: Mapping[str, str], plans: Iterable[TopicPlan], timeout: float = 30.0
) -> dict[str, str]:
    """Creates the planned topics the cluster lacks; returns ``created`` or ``exists`` by name.

    Raises:
        RuntimeFailure: The cluster refused a topic (e.g. more replicas than brokers), or did
            not answer in time.
    """
    wanted = list(plans)
    if not wanted:
        return {}
    admin = AdminClient(logged(config))
    futures = admin.create_topics(
        [
            NewTopic(p.name, p.partitions, p.replication_factor, config=dict(p.configs))
            for p in wanted
        ],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    out: dict[str, str] = {}
    for name, future in futures.items():
        try:
            future.result(timeout)
            out[name] = "created"
        except KafkaException as e:
            error = e.args[0] if e.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                out[name] = "exists"
                continue
            raise RuntimeFailure(f"cannot create topic {name}: {e}") from e
    _until_visible(
        admin, {p.name: p.partitions for p in wanted if out[p.name] == "created"}, timeout
    )
    return out


def _until_visible(admin: AdminClient, partitions: Mapping[str, int], timeout: float) -> None:
    """Waits until the cluster's metadata shows each topic with at least the given partitions.

    The controller acknowledges a creation before every broker's metadata has it: a `check`
    (or a producer) right after `create` would otherwise find the topic missing.
    """
    deadline = time.monotonic() + timeout
    pending = dict(partitions)
    while pending:
        try:
            topics = admin.list_topics(timeout=max(0.1, deadline - time.monotonic())).topics
        except KafkaException as e:
            raise RuntimeFailure(f"cannot read the cluster's metadata: {e}") from e
        pending = {
            name: n
            for name, n in pending.items()
            if name not in topics
            or topics[name].error is not None
            or len(topics[name].partitions) < n
        }
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise RuntimeFailure(f"topics created but not yet visible: {sorted(pending)}")
        time.sleep(0.1)


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
            "logger": client_logger(),
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
                    continue  # unreadable headers (see processor._kafka.client.to_record)
                kind = headers.get(HEADER_MESSAGE_TYPE)
                if kind is not None and kind.decode(errors="replace") in skip_types:
                    continue
                partition = msg.partition()
                if partition is not None:
                    out.append((key, partition))
        return out
    finally:
        consumer.close()
