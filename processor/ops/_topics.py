"""The topics the processor needs, and how the cluster's topics compare with them.

Pure: `saga-processor topics plan|create|check` (processor/_cli/topics.py) feeds it the topics the
sagas read and write and what the cluster holds, and prints what it says. A topic the processor
reads or writes must exist, keep every record until it is consumed (``cleanup.policy`` without
``compact``: a compacted topic keeps only the latest record of a key, so a saga's earlier events
would be lost), hold the largest record the processor accepts (``max.message.bytes``), and have
at least the planned partitions (more is a growth, which the processor follows).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from processor._ports.cluster import TopicFound, TopicPlan

__all__ = ["TopicsVerdict", "check_topics", "plan_topics"]

# Kafka's own default for max.message.bytes (1 MiB plus a batch's overhead): never plan below it.
KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
# Room for a record's headers and its batch's framing beyond the value the processor accepts.
RECORD_OVERHEAD = 16 * 1024


@dataclass
class TopicsVerdict:
    """What ``check_topics`` found: problems fail the check, notes do not."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing failed the check."""
        return not self.problems


def plan_topics(
    read: Iterable[str],
    written: Iterable[str],
    *,
    partitions: int,
    replication_factor: int,
    max_record_bytes: int,
) -> list[TopicPlan]:
    """Every topic the processor reads or writes, with its partitions, replicas and configs.

    Args:
        read: Topics it consumes (prefix applied).
        written: Topics it produces to and does not read (commands, dead letters).
        partitions: Partitions of a topic it creates.
        replication_factor: Replicas of each partition.
        max_record_bytes: The largest record the processor accepts
            (``SAGA_CONSUMER__MAX_RECORD_BYTES``).
    """
    configs = {
        "cleanup.policy": "delete",
        "max.message.bytes": str(
            max(KAFKA_DEFAULT_MAX_MESSAGE_BYTES, max_record_bytes + RECORD_OVERHEAD)
        ),
    }
    reads = sorted(set(read))
    writes = sorted(set(written) - set(reads))
    return [
        TopicPlan(name, role, partitions, replication_factor, dict(configs))
        for role, names in (("reads", reads), ("writes", writes))
        for name in names
    ]


def check_topics(
    plans: Iterable[TopicPlan], found: Mapping[str, TopicFound | None], max_record_bytes: int
) -> TopicsVerdict:
    """Compares the cluster's topics with the plan; every mismatch is named with its topic."""
    verdict = TopicsVerdict()
    for plan in plans:
        what = f"topic {plan.name!r} (the processor {plan.role} it)"
        topic = found.get(plan.name)
        if topic is None:
            verdict.problems.append(f"{what} does not exist: `saga-processor topics create`")
            continue
        if topic.partitions < plan.partitions:
            verdict.problems.append(
                f"{what} has {topic.partitions} partition(s), fewer than the planned "
                f"{plan.partitions} (SAGA_TOPICS__PARTITIONS): add partitions to it"
            )
        elif topic.partitions > plan.partitions:
            verdict.notes.append(
                f"{what} has {topic.partitions} partitions, more than the planned "
                f"{plan.partitions}: a growth, which the processor follows"
            )
        policy = topic.configs.get("cleanup.policy", "delete")
        if "compact" in policy:
            verdict.problems.append(
                f"{what} has cleanup.policy={policy}: compaction keeps only a key's latest "
                "record, so a saga's earlier records can be lost; use delete"
            )
        limit = topic.configs.get("max.message.bytes")
        if limit is not None and limit.isdigit() and int(limit) < max_record_bytes:
            verdict.problems.append(
                f"{what} has max.message.bytes={limit}, below the {max_record_bytes} bytes the "
                "processor accepts (SAGA_CONSUMER__MAX_RECORD_BYTES)"
            )
    return verdict
