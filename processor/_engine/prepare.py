"""The first half of the batch recipe: decoded records routed, and what planning them reads.

Every caller makes a batch the same two steps: :meth:`processor._engine.plan.Planner.prepare`
(this module) routes decoded records and names the rows to load; the caller loads them through
its store; :meth:`processor._engine.plan.Planner.apply` plans the batch over them. The consumer
worker, its recovery, the replay of a parked saga and the saga fixture all do exactly this, so
a change to how a batch is made has one place to go.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from processor._engine.decode import Decoded, Event, Rejected
from processor._engine.route import Router
from processor._engine.rows import SagaKey, Wants
from processor._engine.working import Item
from processor._wire import HEADER_SAGA_TYPE

__all__ = ["Prepared", "prepare"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """Decoded records routed to their sagas, ready to plan once ``wants`` is loaded.

    Attributes:
        decoded: The records, in log order.
        items: Each record expanded into per-saga items, or rejected, in log order.
        wants: The rows planning the items reads.
        unrouted: Events of a type no saga handles, for the counts.
        foreign: Replies addressed to saga types this processor does not run, by (topic, saga
            type): another deployment's, on a shared topic.
        last: Per (topic, partition), the offset after its last record here.
    """

    decoded: Sequence[Decoded]
    items: list[Item | Rejected]
    wants: Wants
    unrouted: int = 0
    foreign: Counter[tuple[str, str]] = field(default_factory=Counter)
    last: dict[tuple[str, int], int] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> Prepared:
        """A batch of no records (one that only stores positions)."""
        return cls([], [], Wants(set(), set(), set()))

    @property
    def size(self) -> int:
        """Records in the batch."""
        return len(self.decoded)

    def sagas(self) -> set[SagaKey]:
        """The sagas the items go to."""
        return {(i.bound.saga_type, i.saga_id) for i in self.items if isinstance(i, Item)}


def prepare(router: Router, decoded: Sequence[Decoded], only: SagaKey | None = None) -> Prepared:
    """Routes ``decoded`` and counts what no saga here takes; see :meth:`Planner.prepare`."""
    items, wants = router.route(decoded)
    if only is not None:
        items, wants = _share_of(only, items, wants)
    routed = router.event_types  # a fresh set per access: taken once per batch
    addressed_elsewhere = router.addressed_elsewhere
    unrouted = 0
    foreign: Counter[tuple[str, str]] = Counter()
    last: dict[tuple[str, int], int] = {}
    # One pass over the records, not three: the consumer runs this for every record it reads.
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
    return Prepared(decoded, items, wants, unrouted, foreign, last)


def _share_of(
    key: SagaKey, items: list[Item | Rejected], wants: Wants
) -> tuple[list[Item | Rejected], Wants]:
    """Only ``key``'s items (and the rejected records), and only the rows they read.

    A parked saga's replay: an event may also feed sagas of other types, which saw it when it
    was first consumed. The saga's own row is loaded even when nothing routes to it any more.
    """
    mine = [x for x in items if isinstance(x, Rejected) or (x.bound.saga_type, x.saga_id) == key]
    share = Wants(
        {key},
        {k for k in wants.message_keys if k[:2] == key},
        wants.deadline_ids,
        operator_keys={k for k in wants.operator_keys if k[:2] == key},
    )
    return mine, share
