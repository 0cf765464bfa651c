"""Decisions about input topics that grew: which partitions wait, and on what.

When a topic grows from M partitions to a multiple N of M, every saga whose partition changes
moves from an old partition ``p`` to a new partition ``q`` with ``q % M == p`` (see
:mod:`processor._engine.partitioner`). Producers switch when they next refresh their metadata
(every 5 minutes by default), some never do (a producer that places records itself), and the
processor cannot know when every producer has. So no time is trusted. Instead a record of ``q``
is applied only once ``p`` has been consumed past the high watermark ``p`` had when that record
was read: whatever a producer sent to ``p`` before it sent the record to ``q`` is applied first
(see :func:`follows`). The rule holds for as long as the topic lives; its cost is that ``q``'s
records wait for ``p``'s lag, which is short while ``p`` keeps up.

Old partitions never wait: a key that stays where it was has no earlier records elsewhere.
Everything here is pure; :mod:`processor._runtime.growth` feeds it from Kafka and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from processor._engine.partitioner import Partitioner, partition_for

__all__ = [
    "Growth",
    "GrowthState",
    "ancestors",
    "follows",
    "growth_of",
    "growth_problem",
    "held",
    "originals",
    "route",
    "router",
]

TP = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Growth:
    """One recorded growth of an input topic, as the consumer group saw it.

    Attributes:
        topic: The input topic.
        old_count: Partitions before.
        new_count: Partitions after (a multiple of ``old_count``).
        noticed_at: When a replica first saw the new count (the database's clock).
    """

    topic: str
    old_count: int
    new_count: int
    noticed_at: datetime

    def creates(self, partition: int) -> bool:
        """Whether ``partition`` is one of the partitions this growth added."""
        return self.old_count <= partition < self.new_count

    def new_partitions(self) -> range:
        """The partitions this growth added."""
        return range(self.old_count, self.new_count)


@dataclass(frozen=True, slots=True)
class GrowthState:
    """What the database holds about one consumer group's input topics.

    Attributes:
        now: The database's clock when this was read.
        counts: The partition count the group knows for each topic.
        growths: Every recorded growth, oldest first per topic.
    """

    now: datetime
    counts: Mapping[str, int] = field(default_factory=dict)
    growths: tuple[Growth, ...] = ()


def growth_problem(topic: str, old: int, new: int) -> str | None:
    """Why a change of partition count cannot be followed online; None when it can.

    Only growth to a multiple keeps every moved key's old partition at ``q % old``; any other
    count moves keys between old partitions too, which no barrier on new partitions can order.
    """
    if new < old:
        return f"topic {topic!r} went from {old} to {new} partitions: Kafka cannot shrink a topic"
    if new % old != 0:
        fit = old * -(-new // old)
        return (
            f"topic {topic!r} grew from {old} to {new} partitions, not a multiple of {old}: "
            f"the new partitions stay unconsumed (grow it to a multiple, e.g. {fit})"
        )
    return None


def growth_of(growths: Iterable[Growth], topic: str, partition: int) -> Growth | None:
    """The growth that added ``partition`` to ``topic``, if a recorded one did."""
    for g in growths:
        if g.topic == topic and g.creates(partition):
            return g
    return None


def ancestors(growths: Iterable[Growth], topic: str, partition: int) -> tuple[int, ...]:
    """The partitions a producer that has not learnt of ``topic``'s growths may send to instead.

    A producer that still hashes with an old count ``M`` puts a key of ``partition`` on
    ``partition % M``; after 6 -> 12 -> 24, partition 20's records may also arrive on 8 and 2.
    Empty for a partition that existed before every growth.
    """
    out = {partition % g.old_count for g in growths if g.topic == topic}
    out.discard(partition)
    return tuple(sorted(out))


def follows(marks: Mapping[int, int], committed: Mapping[int, int | None]) -> bool:
    """Whether every partition in ``marks`` is consumed up to its mark.

    Args:
        marks: High watermark per ancestor partition, taken after the records that wait on them
            were read: everything sent there before those records lies below.
        committed: The group's stored next offset per partition (None or absent: nothing yet).
    """
    for p, mark in marks.items():
        if mark <= 0:
            continue
        position = committed.get(p)
        if position is None or position < mark:
            return False
    return True


def held(tp: TP, counts: Mapping[str, int]) -> bool:
    """Whether an assigned partition must wait before it is claimed and consumed.

    A topic whose count is not known yet, or a partition beyond the known count (a growth not
    recorded yet, or one refused), waits.
    """
    topic, partition = tp
    known = counts.get(topic)
    return known is None or partition >= known


def route(
    key: bytes,
    stored: int,
    count: int | None,
    original: int | None,
    partitioner: Partitioner,
) -> int:
    """The input partition for a record of the saga keyed ``key`` that was on ``stored``.

    After a growth a saga's records go where its key hashes now; the stored partition is kept
    when no count is known, or when the key does not hash to ``stored`` at the topic's original
    count (the producers use another partitioner than configured: better the old partition
    than a wrong one).

    Args:
        key: The saga's key (its id).
        stored: The partition its input was on when the row was written.
        count: The topic's partition count now, if known.
        original: The smallest count recorded for the topic (before its first growth).
        partitioner: The producers' partitioner.
    """
    if count is None or original is None or count % original != 0:
        return stored
    target = partition_for(key, count, partitioner)
    if target % original != stored % original:
        return stored
    return target


def originals(state: GrowthState) -> dict[str, int]:
    """Per topic, the smallest count recorded: the count before its first growth."""
    original: dict[str, int] = dict(state.counts)
    for g in state.growths:
        original[g.topic] = min(original.get(g.topic, g.old_count), g.old_count)
    return original


def router(state: GrowthState, partitioner: Partitioner) -> Callable[[str, bytes, int], int]:
    """:func:`route` over ``state``: (topic, key, stored partition) -> the partition now."""
    original = originals(state)
    counts = dict(state.counts)

    def to(topic: str, key: bytes, stored: int) -> int:
        return route(key, stored, counts.get(topic), original.get(topic), partitioner)

    return to
