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
    """

    def __init__(self) -> None:
        self.owned: dict[TP, Owned] = {}
        self.epochs: Mapping[TP, int] = {}
        self.unclaimed: set[TP] = set()
        self.to_pause: set[TP] = set()
        self.held = 0
        self.claim_after = 0.0

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
        self.held = min(self.held, len(self.unclaimed))
        self.to_pause -= gone

    def clear(self) -> None:
        """Forgets every partition: this replica is giving them all back."""
        self.owned.clear()
        self.publish()
        self.unclaimed.clear()
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
    ) -> None:
        self._ownership = ownership
        self._lanes = lanes
        self._owner = owner
        self._gate = gate
        self._on_owned = on_owned
        self._clock = clock

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
        lanes = self._lanes
        try:
            claimed = lanes.on_control(lambda: lanes.control.claim(tps, self._owner), "claim")
        except LockBusy as e:
            # The previous owner's relay is still publishing these partitions' outbox rows (or
            # its batch is committing): the database answers, so this is no outage. Try again
            # shortly, without holding up the loop on every poll meanwhile.
            ownership.claim_after = self._clock() + CLAIM_RETRY
            log.info("partitions %s still busy (%s); they wait, paused", tps, e)
            return {}
        except RuntimeFailure as e:
            if e.kind is Failure.FATAL:
                raise
            # A frozen previous owner may hold these rows until the server ends its idle
            # transaction, or the database is down: keep them paused and try again later
            # rather than fail the rebalance and leave them to yet another replica. Back off, so
            # an outage costs a few tries (and log lines) a second rather than one per poll.
            lanes.availability.failed(back_off=True)
            log.warning("could not claim %s yet (%s); they wait, paused", tps, e)
            return {}
        lanes.availability.succeeded()
        for tp, (epoch, nxt) in claimed.items():
            ownership.owned[tp] = Owned(epoch, nxt)
            ownership.unclaimed.discard(tp)
        ownership.publish()
        if claimed:
            # Relaying moves with the partition: its rows are ours to publish now.
            self._on_owned()
        log.info("assigned %s", sorted(claimed))
        return claimed
