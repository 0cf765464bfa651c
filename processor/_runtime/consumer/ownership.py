"""Which input partitions this replica owns, under which epochs, and how it claims them.

The group assigns partitions; the replica owns one only once it has claimed it in the store,
which bumps the partition's epoch and so fences every batch of its previous owner. Assigned
partitions not yet claimed wait, paused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from processor._errors import Failure, LockBusy, RuntimeFailure
from processor._ports import TP
from processor._runtime.consumer.access import StoreLanes
from processor._runtime.consumer.availability import Availability
from processor._runtime.consumer.batch import Owned

# The worker's log lines keep the one logger name operators filter on, whichever of its
# modules writes them.
log = logging.getLogger("processor._runtime.consumer.worker")
# Seconds between tries to claim partitions whose rows another session holds.
CLAIM_RETRY = 1.0


class Ownership:
    """The partitions this replica owns and those assigned to it but not claimed yet.

    Made before the worker and the relay, and given to both: the worker changes it on its
    consuming thread, the relay reads :meth:`current` from its own.

    Attributes:
        owned: The owned partitions, with their epochs and next offsets.
        epochs: The owned partitions' epochs, replaced whole on every change: other threads
            read it without a lock.
        unclaimed: Assigned by the group but not yet claimed in the store: paused until claimed.
        to_pause: Partitions to pause at the next poll (the client assigns them only once the
            rebalance callback returns).
        held: Unclaimed partitions held back by the gate (a topic's growth).
        claim_after: No claim retry before this time (the worker's clock): the rows were busy.
        on_node: Unclaimed partitions whose claim failed on the one node their rows live on
            (a Citus worker, tables by bucket) while other nodes answered: they wait for it,
            and count for no outage of the database.
    """

    def __init__(self) -> None:
        self.owned: dict[TP, Owned] = {}
        self.epochs: Mapping[TP, int] = {}
        self.unclaimed: set[TP] = set()
        self.to_pause: set[TP] = set()
        self.held = 0
        self.claim_after = 0.0
        self.on_node: set[TP] = set()

    def current(self) -> Mapping[TP, int]:
        """The owned partitions' epochs now (for the relay: it publishes only their rows)."""
        return self.epochs

    def publish(self) -> None:
        """Replaces :attr:`epochs` after :attr:`owned` changed."""
        self.epochs = {tp: o.epoch for tp, o in self.owned.items()}

    def revoked(self, gone: set[TP]) -> None:
        """Forgets partitions the group took away, claimed or not."""
        for tp in gone:
            self.owned.pop(tp, None)
        self.publish()
        self.unclaimed -= gone
        self.on_node -= gone
        self.held = min(self.held, len(self.unclaimed))
        self.to_pause -= gone

    def clear(self) -> None:
        """Forgets every partition: this replica is giving them all back."""
        self.owned.clear()
        self.publish()
        self.unclaimed.clear()
        self.on_node.clear()
        self.to_pause.clear()


class Claims:
    """Claims assigned partitions in the store, on the control lane.

    Args:
        ownership: What is owned; claimed partitions are added to it.
        lanes: The control store and the database's availability.
        owner: This replica's name, stored with each claim.
        gate: True for an assigned partition that must not be claimed yet (a topic's growth).
        on_owned: Called after each gain (wakes the relay: the partitions' rows are ours now).
        clock: The worker's clock.
        place: Where a partition's rows live (tables by bucket: its Citus worker); each place's
            partitions are claimed on their own, so a node that does not answer holds back
            only its own. None: every partition's rows live together.
    """

    def __init__(
        self,
        ownership: Ownership,
        lanes: StoreLanes,
        *,
        owner: str,
        gate: Callable[[TP], bool] | None,
        on_owned: Callable[[], None],
        clock: Callable[[], float],
        place: Callable[[TP], object] | None = None,
    ) -> None:
        self._ownership = ownership
        self._lanes = lanes
        self._owner = owner
        self._gate = gate
        self._on_owned = on_owned
        self._clock = clock
        self._place = place
        # Paces the claims of partitions waiting on their node (backing off to a few seconds).
        self._node_pace = Availability(clock)

    def assigned(self, tps: Iterable[TP]) -> dict[TP, tuple[int, int | None]]:
        """Notes newly assigned partitions and claims what it can; the rest wait, paused."""
        tps = list(tps)
        self._ownership.unclaimed.update(tps)
        # Only these: partitions assigned earlier and still waiting are paused at the next poll
        # and claimed there, then sought to their stored positions and resumed. Claimed here,
        # the pause still due would stop them for good, and no seek would move them (found by
        # the simulation, tests/sim: two assignments before a poll, the database back between).
        claimed = self.claim(only=set(tps))
        # Paused right after the rebalance callback returns (the client assigns them then).
        self._ownership.to_pause.update(tp for tp in tps if tp not in claimed)
        return claimed

    def due(self) -> bool:
        """Whether the partitions waiting to be claimed may be tried again now."""
        return self._clock() >= self._ownership.claim_after

    def claim(self, only: set[TP] | None = None) -> dict[TP, tuple[int, int | None]]:
        """Claims the unclaimed partitions the gate lets through: their epochs and positions.

        Args:
            only: Claim only these (of those unclaimed); None: all.
        """
        ownership = self._ownership
        # Partitions a topic's growth added wait, unclaimed and paused, until the old partitions
        # their sagas came from are consumed far enough (processor/_runtime/growth.py).
        gate = self._gate
        free = sorted(tp for tp in ownership.unclaimed if gate is None or not gate(tp))
        ownership.held = len(ownership.unclaimed) - len(free)
        tps = free if only is None else [tp for tp in free if tp in only]
        if not tps:
            return {}
        groups = self._by_place(tps)
        claimed: dict[TP, tuple[int, int | None]] = {}
        failed: dict[object, tuple[list[TP], RuntimeFailure]] = {}
        for place, group in groups.items():
            try:
                claimed.update(self._claim_group(group))
            except LockBusy as e:
                # The previous owner's relay is still publishing these partitions' outbox rows
                # (or its batch is committing): the database answers, so this is no outage.
                # Try again shortly, without holding up the loop on every poll meanwhile.
                ownership.claim_after = self._clock() + CLAIM_RETRY
                log.info("partitions %s still busy (%s); they wait, paused", group, e)
            except RuntimeFailure as e:
                if e.kind is Failure.FATAL:
                    raise
                failed[place] = (group, e)
        if failed:
            self._failed(failed, answered=bool(claimed))
        if not claimed:
            return {}
        self._owned(claimed)
        return claimed

    def _by_place(self, tps: list[TP]) -> dict[object, list[TP]]:
        place = self._place
        if place is None:
            return {None: tps}
        groups: dict[object, list[TP]] = {}
        for tp in tps:
            groups.setdefault(place(tp), []).append(tp)
        return groups

    def _claim_group(self, tps: list[TP]) -> dict[TP, tuple[int, int | None]]:
        lanes = self._lanes
        return lanes.on_control(lambda: lanes.control.claim(tps, self._owner), "claim")

    def _failed(
        self, failed: dict[object, tuple[list[TP], RuntimeFailure]], answered: bool
    ) -> None:
        """Claims that failed: on their node alone when another node answered, else an outage."""
        ownership = self._ownership
        place = self._place
        elsewhere = answered or (
            place is not None and any(place(tp) not in failed for tp in ownership.owned)
        )
        if not elsewhere:
            # A frozen previous owner may hold these rows until the server ends its idle
            # transaction, or the database is down: keep them paused and try again later
            # rather than fail the rebalance and leave them to yet another replica. Back off,
            # so an outage costs a few tries (and log lines) a second rather than one per poll.
            self._lanes.availability.failed(back_off=True)
            for group, e in failed.values():
                log.warning("could not claim %s yet (%s); they wait, paused", group, e)
            return
        # Other nodes answer: the partitions wait for theirs, which every replica would meet
        # as well, so they count for no outage (nor toward giving the partitions back).
        self._node_pace.failed(back_off=True)
        ownership.claim_after = max(ownership.claim_after, self._node_pace.retry_at)
        for where, (group, e) in failed.items():
            fresh = sorted(set(group) - ownership.on_node)
            ownership.on_node.update(group)
            if fresh:
                log.warning(
                    "could not claim %s (%s): their rows live on %s; they wait, paused, until "
                    "it answers; the others go on",
                    fresh,
                    e,
                    where,
                )

    def _owned(self, claimed: dict[TP, tuple[int, int | None]]) -> None:
        ownership = self._ownership
        back = sorted(ownership.on_node & set(claimed))
        if back:
            log.warning("claimed %s: the node their rows live on answers again", back)
            ownership.on_node -= set(back)
        if not ownership.on_node:
            self._node_pace.succeeded()
        self._lanes.availability.succeeded()
        for tp, (epoch, nxt) in claimed.items():
            ownership.owned[tp] = Owned(epoch, nxt)
            ownership.unclaimed.discard(tp)
        ownership.publish()
        # Relaying moves with the partition: its rows are ours to publish now.
        self._on_owned()
        log.info("assigned %s", sorted(claimed))
