"""Notices input records whose key the configured partitioner would send elsewhere.

Everything that keeps a saga on one partition rests on the input topics' producers and this
processor hashing saga ids the same way: the deadline poller and operator records route by
hash after a growth, the growth barrier orders old and new partitions by it. A producer with
another partitioner (Java's murmur2 against librdkafka's CRC32 default, say) breaks that without
any error. Each applied input record's key is checked against its partition at the counts in
play (a grown topic's old count too, for producers that have not refreshed), counted by topic
for the metrics endpoint, and logged once per topic and pattern, naming the partitioner that
would have matched.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable

from processor.engine.decode import Decoded, Event
from processor.engine.partitioner import Partitioner, fits, matching

__all__ = ["PlacementCheck"]

log = logging.getLogger(__name__)


class PlacementCheck:
    """Counts and logs keyed input records that are not where the partitioner puts them.

    Args:
        partitioner: ``SAGA_CONSUMER__PARTITIONER``.
        counts: The partition counts a topic's producers may hash with now (the known count,
            and the old one while a growth is recent); empty when unknown (nothing checked).

    Attributes:
        off_partition: Records found elsewhere, by topic.
    """

    def __init__(self, partitioner: Partitioner, counts: Callable[[str], tuple[int, ...]]) -> None:
        self.partitioner = partitioner
        self._counts = counts
        self.off_partition: Counter[str] = Counter()
        self._logged: set[tuple[str, tuple[str, ...]]] = set()

    def check(self, decoded: Iterable[Decoded]) -> None:
        """Checks the events among ``decoded`` (fired deadlines and operator records are ours)."""
        counts: dict[str, tuple[int, ...]] = {}
        for d in decoded:
            if type(d) is not Event:
                continue
            r = d.record
            if r.key is None:
                continue
            n = counts.get(r.topic)
            if n is None:
                n = counts[r.topic] = self._counts(r.topic)
            if not n or fits(r.key, r.partition, n, self.partitioner):
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
                "(message_type=%s saga_id=%s message_id=%s at %s/%d@%d); %s. Deadlines and "
                "operator records of such sagas go to another partition than their events, "
                "and a growth cannot keep their order. Logged once per topic and pattern; "
                "metric saga_records_off_partition",
                r.topic,
                self.partitioner,
                d.metadata.message_type,
                r.key.decode(errors="replace"),
                d.metadata.message_id,
                r.topic,
                r.partition,
                r.offset,
                hint,
            )
