"""What the worker reads ahead of its batches: records carried over, waiting, or read to the end.

A batch takes records carried over from the last one first (read beyond its byte bound), then
records of a grown topic's new partitions that were cleared while they waited, then what the
consumer reads now, less the records of new partitions that must wait. Everything held here is
read again from the stored positions after a resync, so a resync drops it all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from itertools import groupby
from operator import attrgetter
from typing import Protocol

from processor._engine.plan import Prepared
from processor._engine.records import Record
from processor._ports import TP, RecordConsumer
from processor._runtime.consumer.batch import Batch, Limits
from processor._runtime.consumer.ownership import Ownership
from processor._runtime.consumer.stats import WorkerStats

# A batch of one place (tables distributed by bucket) reads on for more of its place's records
# while the other places' carried records stay below this many batches' worth.
CARRY_BATCHES = 4

# A record's partition, as the grouping key of its run.
_TP = attrgetter("topic", "partition")

# A grown topic's new partition whose oldest waiting record has waited this long counts as
# waiting on its growth (the gauge and its alert): the partitions it follows are not consumed.
FOLLOW_SLOW = 30.0


class Follow(Protocol):
    """When records of a grown topic's new partitions may be applied (_runtime/growth.py)."""

    def ancestors(self, tp: TP) -> tuple[int, ...]:
        """The partitions a late producer may send ``tp``'s keys to instead; empty if none."""
        ...

    def cleared(self, tp: TP) -> float:
        """Records of ``tp`` read at or before this time (the worker's clock) may be applied."""
        ...

    def want(self, tp: TP) -> None:
        """Asks that records of ``tp`` read up to now be cleared."""
        ...


class Intake:
    """Takes each batch's records from the consumer and holds what is read ahead of it.

    Args:
        consumer: Where records are read.
        ownership: The owned partitions (records of others are not held) and how many wait
            unclaimed on a topic's growth.
        limits: Shared batch bounds.
        stats: Where each :meth:`take` notes how many partitions wait on a topic's growth.
        follow: Holds a grown topic's new partitions' records until what late producers sent
            to the partitions they grew from is applied; None: nothing waits.
        clock: The worker's clock.
        colocate: Where a partition's rows live (a Citus worker, when the tables are
            distributed by bucket): a batch takes the records of one place only and carries
            the others to the next, so that each batch commits on one node. None: one place.

    Attributes:
        carry: Records read beyond the batch's byte bound, first in line for the next batch.
    """

    def __init__(
        self,
        consumer: RecordConsumer,
        ownership: Ownership,
        limits: Limits,
        stats: WorkerStats,
        *,
        follow: Follow | None,
        clock: Callable[[], float],
        colocate: Callable[[TP], object] | None = None,
    ) -> None:
        self._consumer = consumer
        self._ownership = ownership
        self._limits = limits
        self._stats = stats
        self.follow = follow
        self._clock = clock
        self.carry: list[Record] = []
        self._colocate = colocate
        # How many batches of other places each place's oldest records gave way to (see
        # _fill_one_place).
        self._passed_over: dict[object, int] = {}
        # Partitions whose place stopped answering (Recovery): paused, and what was read of
        # them before the pause is dropped; read again from their stored positions.
        self.away: set[TP] = set()
        # Records of new partitions waiting on the partitions they follow, with when each was
        # read; a partition with any waits whole, in order, and is paused once it holds a batch.
        self._deferred: dict[TP, list[tuple[float, Record]]] = {}
        self._follow_paused: set[TP] = set()
        # Partitions read to their end, and the position there (past transaction markers).
        self._ends: dict[TP, int] = {}
        # New partitions whose records have waited FOLLOW_SLOW.
        self._slow = 0

    def take(self) -> list[Record]:
        """Up to batch-size records and about max-batch-bytes, carried-over ones first.

        Then records of new partitions that were cleared while they waited, then what the
        consumer reads now, less the records of new partitions that must wait.
        """
        limits = self._limits
        records, self.carry = self.carry, []
        self._slow = 0
        if self._deferred:
            records.extend(self._release(limits.batch_size - len(records)))
        self._stats.growth_waiting = self._ownership.held + self._slow
        room = limits.batch_size - len(records)
        if room > 0:
            wait = 0.0 if records or self._deferred else limits.batch_timeout
            fresh = self._consumer.consume(room, wait)
            records.extend(self._defer(fresh) if self.follow is not None else fresh)
        self._note_ends()
        if self.away and records:
            records = [r for r in records if (r.topic, r.partition) not in self.away]
        if self._colocate is not None and records:
            records = self._fill_one_place(records, self._colocate)
        size = 0
        for i, r in enumerate(records):
            size += len(r.value or b"") + len(r.key or b"")
            if size > limits.max_batch_bytes and i > 0:
                self.carry = records[i:] + self.carry
                return records[:i]
        return records

    def place(self, tp: TP) -> object:
        """Where ``tp``'s rows live; None when every partition's rows live together."""
        return None if self._colocate is None else self._colocate(tp)

    def _fill_one_place(
        self, records: list[Record], colocate: Callable[[TP], object]
    ) -> list[Record]:
        """The records whose rows live where the first one's do; the rest go first next time.

        Each partition's records keep their order: a partition's records are all taken or all
        carried. A batch of one place is filled as full as a batch of all would be, from what
        the consumer holds already: half-full batches (two workers) doubled the two-phase
        commits per event and cost S8 a fifth of its rate. The others' records are carried,
        up to CARRY_BATCHES batches' worth, in records and in bytes.
        """
        where: dict[TP, object] = {}

        def runs(batch: list[Record]) -> list[tuple[object, list[Record]]]:
            # The consumer hands records over a partition's run at a time: one lookup a run,
            # not one a record (a record waits in the carry for several batches).
            out: list[tuple[object, list[Record]]] = []
            for tp, run in groupby(batch, _TP):
                found = where.get(tp)
                if found is None:
                    found = where[tp] = colocate(tp)
                out.append((found, list(run)))
            return out

        held = runs(records)
        first = held[0][0]
        if first is None:  # no places: every partition's rows live together
            return records
        limits = self._limits
        counts: Counter[object] = Counter()
        sizes: Counter[object] = Counter()

        def count(more: list[tuple[object, list[Record]]]) -> None:
            for at, run in more:
                counts[at] += len(run)
                sizes[at] += sum(len(r.value or b"") + len(r.key or b"") for r in run)

        count(held)
        total, total_bytes = len(records), sizes.total()
        ended = False
        # Large records fill a batch's bytes long before its count: the carry is bounded by
        # both, or it would hold CARRY_BATCHES x batch-size records of up to max-record-bytes.
        while (
            len(counts) > 1
            and counts[first] < limits.batch_size
            and sizes[first] < limits.max_batch_bytes
            and total - counts[first] < CARRY_BATCHES * limits.batch_size
            and total_bytes - sizes[first] < CARRY_BATCHES * limits.max_batch_bytes
        ):
            fresh = self._consumer.consume(limits.batch_size - counts[first], 0)
            if not fresh:
                ended = True
                break
            self._note_ends()
            if self.follow is not None:
                fresh = self._defer(fresh)
            if self.away:
                fresh = [r for r in fresh if (r.topic, r.partition) not in self.away]
            more = runs(fresh)
            held += more
            count(more)
            total, total_bytes = total + len(fresh), sizes.total()
        chosen = first
        fullest, most = counts.most_common(1)[0]
        passed = self._passed_over.get(first, 0)
        if (
            counts[first] < limits.batch_size
            and sizes[first] < limits.max_batch_bytes
            and not ended
            and most > counts[first]
            and passed < CARRY_BATCHES
        ):
            # The other places' records reached the carry's bound before this place's filled
            # a batch (the consumer hands records over a partition's run at a time): a full
            # batch of the place that has one while this place's records gather, which then
            # go in a batch of their own, full or not, after CARRY_BATCHES such batches at most.
            chosen = fullest
            self._passed_over[first] = passed + 1
        self._passed_over.pop(chosen, None)
        taken: list[Record] = []
        rest: list[Record] = []
        for at, run in held:
            room = limits.batch_size - len(taken) if at == chosen else 0
            if room >= len(run):
                taken += run
            else:
                taken += run[:room]
                rest += run[room:]
        if rest:
            # In the order read: each partition's records keep theirs.
            self.carry = rest + self.carry
        return taken

    def claimed(self, tps: Iterable[TP]) -> None:
        """Partitions just claimed start from their stored positions: no end is kept for them."""
        for tp in tps:
            self._ends.pop(tp, None)

    def revoked(self, gone: set[TP]) -> None:
        """Drops what is held of partitions the group took away."""
        self.carry = [r for r in self.carry if (r.topic, r.partition) not in gone]
        for tp in gone:
            self._deferred.pop(tp, None)
            self._ends.pop(tp, None)
        self._follow_paused -= gone
        self.away -= gone

    def drop(self) -> None:
        """Drops everything read ahead: it is read again after the seeks back to the store."""
        self.carry = []
        self._deferred.clear()
        self._ends.clear()
        if self._follow_paused:
            # Not those set aside: they wait paused for their place (Recovery.bring_back).
            back = (self._follow_paused & set(self._ownership.owned)) - self.away
            self._consumer.resume(sorted(back))
        self._follow_paused.clear()

    def _defer(self, fresh: list[Record]) -> list[Record]:
        """``fresh`` less the records of new partitions that must wait, which are kept."""
        follow = self.follow
        assert follow is not None
        owned = self._ownership.owned
        read_at = self._clock()
        waits: dict[TP, bool] = {}
        out: list[Record] = []
        for r in fresh:
            tp = (r.topic, r.partition)
            queue = self._deferred.get(tp)
            if queue is None:
                must = waits.get(tp)
                if must is None:
                    must = waits[tp] = (
                        tp in owned and bool(follow.ancestors(tp)) and follow.cleared(tp) < read_at
                    )
                if not must:
                    out.append(r)
                    continue
                queue = self._deferred[tp] = []
            queue.append((read_at, r))
        full = []
        for tp, queue in self._deferred.items():
            follow.want(tp)
            if len(queue) >= self._limits.batch_size and tp not in self._follow_paused:
                full.append(tp)
        if full:
            # Bounded memory: a partition that holds a batch's worth reads no more until then.
            self._consumer.pause(full)
            self._follow_paused.update(full)
        return out

    def _release(self, room: int) -> list[Record]:
        """Up to ``room`` waiting records that were cleared, each partition's in order."""
        follow = self.follow
        assert follow is not None
        out: list[Record] = []
        slow = 0
        now = self._clock()
        for tp in list(self._deferred):
            queue = self._deferred[tp]
            cleared = follow.cleared(tp)
            n = 0
            while n < len(queue) and n < room - len(out) and queue[n][0] <= cleared:
                n += 1
            out.extend(r for _, r in queue[:n])
            del queue[:n]
            if queue:
                follow.want(tp)
                slow += now - queue[0][0] >= FOLLOW_SLOW
                continue
            del self._deferred[tp]
            if tp in self._follow_paused:
                self._follow_paused.discard(tp)
                self._consumer.resume([tp])
        self._slow = slow
        return out

    def _note_ends(self) -> None:
        """Keeps where partitions were read to their end, for :meth:`advance_ends`."""
        owned = self._ownership.owned
        for tp, position in self._consumer.ends().items():
            if tp in owned:
                self._ends[tp] = position

    def advance_ends(self, batch: Batch | None) -> Batch | None:
        """``batch`` (or a batch of no records) storing positions past trailing markers.

        A partition read to its end whose last records were transaction markers (or aborted
        records) is stored at its end, not after its last record: a new partition that follows
        it waits for its stored position to reach its high watermark, which no record reaches.
        Only when every record read before the end is applied: none waits, none is carried.
        """
        if not self._ends:
            return batch
        owned = self._ownership.owned
        # With places, a batch stores positions of one place only (its records' place, or
        # the first waiting end's): a batch's transaction stays on one node.
        place: object = None
        if self._colocate is not None:
            first = next(iter(batch.last), None) if batch is not None else None
            place = self.place(first if first is not None else next(iter(self._ends)))
        busy = {tp for tp in self._deferred}
        busy.update((r.topic, r.partition) for r in self.carry)
        if batch is not None:
            busy.update(batch.last)
        advances: dict[TP, int] = {}
        for tp, end in list(self._ends.items()):
            if tp in busy or tp in self.away or (place is not None and self.place(tp) != place):
                continue
            o = owned.get(tp)
            # Nothing stored yet (None) and read to a non-zero end with no record: its only
            # entries were markers (an aborted first transaction), and the end is stored too;
            # left at None, a new partition following it would wait for it for good (found by
            # the simulation, tests/sim).
            done = end == 0 if o is not None and o.next_offset is None else None
            if o is None or done or (o.next_offset is not None and o.next_offset >= end):
                del self._ends[tp]
                continue
            advances[tp] = end
            del self._ends[tp]
        if not advances:
            return batch
        if batch is None:
            return Batch.of(Prepared.empty(), owned, advances)
        return batch.advancing(advances, owned)
