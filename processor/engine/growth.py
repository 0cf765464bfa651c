"""Decisions about input topics that grew: which partitions wait, and when they may go on.

When a topic grows from M partitions to a multiple N of M, every saga whose partition changes
moves from an old partition ``p`` to a new partition ``q`` with ``q % M == p`` (see
:mod:`processor.engine.partitioner`). Producers switch at their next metadata refresh, so for a
while a moved saga's records still land on ``p`` while later ones land on ``q``. Per-saga order
holds if ``q`` is consumed only after everything producers sent to ``p`` before they switched:

1. The growth is noticed (``noticed_at``, the database's clock) and given a barrier time
   ``barrier_at = noticed_at + grace``, grace being at least the producers' metadata refresh
   interval, so that every producer has switched by then.
2. At or after ``barrier_at`` the high watermarks of the old partitions are taken once and
   stored: every record sent to an old partition before the switch lies below them.
3. New partition ``q`` is released once the group's committed position of ``p = q % M`` has
   reached ``p``'s stored watermark.

Old partitions never wait: a key that stays where it was has no earlier records elsewhere.
Everything here is pure; :mod:`processor.runtime.growth` feeds it from Kafka and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from processor.engine.partitioner import Partitioner, partition_for

__all__ = [
    "Growth",
    "GrowthState",
    "barrier",
    "growth_of",
    "growth_problem",
    "held",
    "moved_from",
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
        barrier_at: When producers are taken to have switched: ``noticed_at`` plus the grace.
        watermarks: High watermark per old partition, taken at or after ``barrier_at``; None
            until taken.
        passed_at: When every new partition of this growth was found released; None before.
    """

    topic: str
    old_count: int
    new_count: int
    noticed_at: datetime
    barrier_at: datetime
    watermarks: Mapping[int, int] | None = None
    passed_at: datetime | None = None

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


def barrier(
    growth: Growth, partition: int, now: datetime, committed: Mapping[int, int | None]
) -> str | None:
    """Why new ``partition`` of ``growth`` must still wait; None once it may be consumed.

    Args:
        growth: The growth that added ``partition``.
        partition: A new partition of ``growth``.
        now: The database's clock.
        committed: The group's committed next offset per partition of the topic (None or
            absent: nothing consumed yet).
    """
    if growth.passed_at is not None:
        return None
    if now < growth.barrier_at:
        return f"producers may still send to the old partitions until {growth.barrier_at}"
    if growth.watermarks is None:
        return "the old partitions' high watermarks are not taken yet"
    old = partition % growth.old_count
    mark = growth.watermarks.get(old, 0)
    if mark <= 0:
        return None
    position = committed.get(old)
    if position is None or position < mark:
        return f"partition {old} is consumed up to {position}, not yet to {mark}"
    return None


def held(
    tp: TP, counts: Mapping[str, int], growths: Iterable[Growth], released: AbstractSet[TP]
) -> bool:
    """Whether an assigned partition must wait before it is claimed and consumed.

    A topic whose count is not known yet, or a partition beyond the known count (a growth not
    recorded yet), waits; so does a new partition of a growth until it is released.
    """
    topic, partition = tp
    known = counts.get(topic)
    if known is None or partition >= known:
        return True
    g = growth_of(growths, topic, partition)
    return g is not None and g.passed_at is None and tp not in released


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


def moved_from(growths: Iterable[Growth], now: datetime, keep: timedelta) -> dict[TP, TP]:
    """New partition -> the old one its sagas came from, for growths not long passed.

    Covers growths whose barrier has not passed, and those that passed less than ``keep`` ago.
    """
    out: dict[TP, TP] = {}
    for g in growths:
        if g.passed_at is not None and now - g.passed_at >= keep:
            continue
        for q in g.new_partitions():
            out[(g.topic, q)] = (g.topic, q % g.old_count)
    return out
