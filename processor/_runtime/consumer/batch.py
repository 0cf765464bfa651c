"""One batch as the worker carries it from the consumer to the store."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from processor._engine.decode import Decoded
from processor._engine.plan import Prepared
from processor._engine.records import OffsetCommit
from processor._engine.rows import Wants, WriteSet
from processor._ports import TP


@dataclass
class Owned:
    """A partition this replica owns: its epoch, and where the next batch starts."""

    epoch: int
    next_offset: int | None


@dataclass(frozen=True, slots=True)
class Batch:
    """Records of owned partitions as the planner prepared them, with the offsets they commit.

    Attributes:
        prepared: The records routed (``Planner.prepare``).
        offsets: Each partition's offset compare-and-set.
        last: Per partition, the position the batch leaves it at.
    """

    prepared: Prepared
    offsets: list[OffsetCommit]
    last: dict[TP, int]

    @classmethod
    def of(
        cls,
        prepared: Prepared,
        owned: Mapping[TP, Owned],
        ends: Mapping[TP, int] | None = None,
    ) -> Batch:
        """``prepared``, committing each partition's offset from its ``owned`` position.

        ``ends`` are positions to store for partitions with no record in the batch (past
        transaction markers at their end).
        """
        last = prepared.last
        if ends:
            last = dict(last)
            for tp, end in ends.items():
                last.setdefault(tp, end)
        offsets = [
            OffsetCommit(t, p, nxt, owned[(t, p)].next_offset, owned[(t, p)].epoch)
            for (t, p), nxt in last.items()
        ]
        return cls(prepared, offsets, last)

    @property
    def decoded(self) -> Sequence[Decoded]:
        """The records, in log order."""
        return self.prepared.decoded

    @property
    def wants(self) -> Wants:
        """The rows planning the batch reads."""
        return self.prepared.wants

    @property
    def size(self) -> int:
        """Records in the batch."""
        return self.prepared.size

    @property
    def foreign(self) -> Counter[tuple[str, str]]:
        """Replies addressed to saga types this processor does not run, by (topic, saga type)."""
        return self.prepared.foreign

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
