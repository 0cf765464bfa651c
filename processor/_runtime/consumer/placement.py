"""Notices input records whose key the configured partitioner would send elsewhere.

Everything that keeps a saga on one partition rests on the input topics' producers and this
processor hashing saga ids the same way: the deadline poller and operator records route by
hash after a growth, and a grown topic's new partitions wait on the old ones their keys came
from. A producer with another partitioner (Java's murmur2 against librdkafka's CRC32 default,
say) breaks that without any error. Each applied input record's key is checked against its
partition at the counts in play (every count a grown topic had, for producers that have not
refreshed), counted by topic for the metrics endpoint, and logged once per topic and pattern,
naming the partitioner that would have matched. Records a producer sent where only an old count
puts them are counted too: that producer has not learnt of the growth.

Operator records are the processor's own: their senders route them by the same rules, so one
found on a partition its saga id does not map to is a copy someone else produced there, and it
is dead-lettered (see ``processor._engine.route.misplaced``). The counts are the growth watch's
last round, read from memory: the check adds no I/O to a batch.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

from processor._engine.decode import Decoded, Event, Operator, Rejected
from processor._engine.partitioner import Partitioner, fits, matching, partition_for
from processor._engine.route import misplaced

__all__ = ["PlacementCheck"]

log = logging.getLogger(__name__)


class PlacementCheck:
    """Counts and logs keyed input records that are not where the partitioner puts them.

    Operator records that are not where their saga id goes are rejected instead (see
    :meth:`check`).

    Args:
        partitioner: ``SAGA_CONSUMER__PARTITIONER``.
        counts: The partition counts a topic's producers may hash with now (the known count,
            and the old one while a growth is recent); empty when unknown (nothing checked).

    Attributes:
        off_partition: Records found elsewhere, by topic.
        stale: Records a producer that has not learnt of the topic's growth sent where the old
            count put them, by topic.
    """

    def __init__(self, partitioner: Partitioner, counts: Callable[[str], tuple[int, ...]]) -> None:
        self.partitioner = partitioner
        self._counts = counts
        self.off_partition: Counter[str] = Counter()
        self.stale: Counter[str] = Counter()
        self._logged: set[tuple[str, tuple[str, ...]]] = set()
        self._stale_logged: set[str] = set()

    def check(self, decoded: list[Decoded]) -> list[Decoded]:
        """Checks the keys of the events among ``decoded``, and where operator records are.

        Returns:
            ``decoded`` itself, or when an operator record is on a partition its saga id does
            not map to, a copy with that record rejected in its place.
        """
        counts: dict[str, tuple[int, ...]] = {}
        rejected: dict[int, Rejected] = {}
        for d in decoded:
            if type(d) is not Event:
                if type(d) is Operator and (refused := self._misplaced(d, counts)) is not None:
                    rejected[id(d)] = refused
                continue
            r = d.record
            if r.key is None:
                continue
            n = counts.get(r.topic)
            if n is None:
                n = counts[r.topic] = self._counts(r.topic)
            if not n:
                continue
            if fits(r.key, r.partition, n, self.partitioner):
                if len(n) > 1 and not fits(r.key, r.partition, n[:1], self.partitioner):
                    self._stale(d, n[0])
                continue
            self.off_partition[r.topic] += 1
            would = tuple(matching([(r.key, r.partition)], n))
            if (r.topic, would) in self._logged:
                continue
            self._logged.add((r.topic, would))
            hint = (
                f"the {' or '.join(would)} partitioner would put it there: set "
                f"SAGA_CONSUMER__PARTITIONER={would[0]} or the producers' partitioner to "
                f"{self.partitioner}"
                if would
                else "no known partitioner puts it there (a producer picks partitions itself)"
            )
            log.warning(
                "records on %s are not where SAGA_CONSUMER__PARTITIONER=%s puts their keys "
                "(%s); %s. Deadlines and operator records of such sagas go to another partition "
                "than their events, and a growth cannot keep their order. Logged once per topic "
                "and pattern; metric saga_records_off_partition",
                r.topic,
                self.partitioner,
                _named(d),
                hint,
            )
        if not rejected:
            return decoded
        return [rejected.get(id(d), d) for d in decoded]

    def _misplaced(self, d: Operator, counts: dict[str, tuple[int, ...]]) -> Rejected | None:
        topic = d.record.topic
        n = counts.get(topic)
        if n is None:
            n = counts[topic] = self._counts(topic)
        return misplaced(d, n, self.partitioner)

    def _stale(self, d: Event, count: int) -> None:
        r = d.record
        self.stale[r.topic] += 1
        if r.topic in self._stale_logged:
            return
        self._stale_logged.add(r.topic)
        assert r.key is not None
        log.warning(
            "records on %s come from a producer that has not learnt of its growth to %d "
            "partitions (%s; its key goes to partition %d now). They are applied in order with "
            "what was sent to the new partitions before them, but one sent after another "
            "producer's record of the same saga on the new partition may be applied first: have "
            "the producer refresh its metadata. Logged once per topic; metric "
            "saga_records_from_stale_producers",
            r.topic,
            count,
            _named(d),
            partition_for(r.key, count, self.partitioner),
        )


def _named(d: Event) -> str:
    """The record a warning names: its type, saga id and message id, and where it is."""
    r = d.record
    return (
        f"message_type={d.metadata.message_type} saga_id="
        f"{(r.key or b'').decode(errors='replace')} message_id={d.metadata.message_id} "
        f"at {r.topic}/{r.partition}@{r.offset}"
    )
