"""One batch as the worker carries it from the consumer to the store."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from processor.engine.decode import Decoded, Event, Rejected
from processor.engine.plan import Item, Planner
from processor.engine.records import OffsetCommit
from processor.engine.rows import Wants, WriteSet
from processor.ports import TP
from processor.wire import HEADER_SAGA_TYPE


@dataclass
class Owned:
    """A partition this replica owns: its epoch, and where the next batch starts."""

    epoch: int
    next_offset: int | None


@dataclass(frozen=True, slots=True)
class Batch:
    """Decoded records of owned partitions, routed, with the offsets they will commit."""

    decoded: list[Decoded]
    items: list[Item | Rejected]
    wants: Wants
    unrouted: int
    offsets: list[OffsetCommit]
    last: dict[TP, int]
    size: int
    # Replies addressed to saga types this processor does not run, by (topic, saga type).
    foreign: Counter[tuple[str, str]] = field(default_factory=Counter)

    @classmethod
    def of(
        cls,
        decoded: list[Decoded],
        planner: Planner,
        owned: Mapping[TP, Owned],
        ends: Mapping[TP, int] | None = None,
    ) -> Batch:
        """Routes ``decoded`` and computes each partition's offset compare-and-set.

        ``ends`` are positions to store for partitions with no record in the batch (past
        transaction markers at their end).
        """
        items, wants = planner.route(decoded)
        routed = planner.event_types  # a fresh set per access: taken once per batch
        addressed_elsewhere = planner.addressed_elsewhere
        unrouted = 0
        foreign: Counter[tuple[str, str]] = Counter()
        last: dict[TP, int] = {}
        # One pass over the records, not three: this runs for every record of every batch.
        for d in decoded:
            record = d.record
            last[(record.topic, record.partition)] = record.offset + 1
            if isinstance(d, Event):
                if type(d.message) not in routed:
                    unrouted += 1
                # Only a record with a saga-type header can be addressed elsewhere.
                if (
                    HEADER_SAGA_TYPE in d.metadata.headers
                    and (elsewhere := addressed_elsewhere(d)) is not None
                ):
                    foreign[(record.topic, elsewhere)] += 1
        for tp, end in (ends or {}).items():
            last.setdefault(tp, end)
        offsets = [
            OffsetCommit(t, p, nxt, owned[(t, p)].next_offset, owned[(t, p)].epoch)
            for (t, p), nxt in last.items()
        ]
        return cls(decoded, items, wants, unrouted, offsets, last, len(decoded), foreign)

    def advancing(self, ends: Mapping[TP, int], owned: Mapping[TP, Owned]) -> Batch:
        """This batch, also storing ``ends`` for partitions it has no record of."""
        extra = {tp: end for tp, end in ends.items() if tp not in self.last}
        offsets = [
            *self.offsets,
            *(
                OffsetCommit(t, p, end, owned[(t, p)].next_offset, owned[(t, p)].epoch)
                for (t, p), end in extra.items()
            ),
        ]
        return replace(self, offsets=offsets, last={**self.last, **extra})


@dataclass(frozen=True, slots=True)
class Planned:
    """A batch and the writes planned for it."""

    batch: Batch
    ws: WriteSet
    # Seconds spent loading its rows and planning it (handlers included), for the metrics.
    plan_seconds: float = 0.0


@dataclass(slots=True)
class Limits:
    """The bounds of one worker's batches and of its waits on the database.

    One instance is shared by the worker and the pieces it is built from, so a bound changed on
    it holds for all of them at once.

    Attributes:
        batch_size: Most records in one batch.
        batch_timeout: Seconds a poll waits for records when none are in hand.
        max_batch_bytes: About the most key and value bytes in one batch.
        max_record_bytes: Records larger than this are dead-lettered, not decoded.
        unavailable_timeout: Seconds the database may fail or stay silent before this replica
            gives its partitions back to the group; also the bound on any one database call.
    """

    batch_size: int
    batch_timeout: float
    max_batch_bytes: int
    max_record_bytes: int
    unavailable_timeout: float
