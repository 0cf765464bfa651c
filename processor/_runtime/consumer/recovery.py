"""What the worker does when a batch is not committed, or its commit outcome is unknown.

Every write is a compare-and-set on the stored offsets and epochs, so after any failure the
worker trusts only what the store says was committed: it drops what it read and planned ahead,
reads the stored positions back (resync), seeks to them, and gives up partitions whose epoch
another replica has bumped (fenced). Records the database refuses are dead-lettered or parked
and the rest of their batch committed. A database that stays away for the whole bound gets the
replica's partitions given back to the group, until it answers again.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping

from processor._engine.decode import Decoded, Operator
from processor._engine.rows import SagaKey, WriteSet
from processor._errors import Failure, RuntimeFailure
from processor._ports import TP, RecordConsumer
from processor._runtime.consumer.access import StoreLanes
from processor._runtime.consumer.availability import Availability
from processor._runtime.consumer.batch import Batch, Limits, Owned, Planned
from processor._runtime.consumer.intake import Intake
from processor._runtime.consumer.isolate import isolate_refused
from processor._runtime.consumer.ownership import CLAIM_RETRY, Ownership
from processor._runtime.consumer.stats import WorkerStats
from processor._runtime.consumer.steps import BatchSteps

# The worker's log lines keep the one logger name operators filter on, whichever of its
# modules writes them.
log = logging.getLogger("processor._runtime.consumer.worker")


class Recovery:
    """Resyncs positions from the store, resolves doubt, isolates refused records, detaches.

    Args:
        lanes: The stores, their lanes, and the database's availability.
        ownership: The owned partitions; fenced ones are dropped from it.
        intake: What was read ahead; dropped on every resync.
        consumer: Seeked back to the stored positions; left and rejoined around an outage.
        steps: Prepares, plans and writes the parts of a batch while refused records are
            searched for, as every batch is.
        limits: Shared bounds (the outage bound among them).
        stats: Counts resyncs and rejected batches.
        on_committed: Called with a batch found committed after all (a commit in doubt that
            happened, or what is left of a batch once its refused records are isolated).
        clock: The worker's clock.

    Attributes:
        unsynced: Positions must be read back from the store before the next batch.
        writes_failing: The last commit failed or hung, and none has succeeded since.
        detached: The partitions were given back because the database stayed away.
    """

    def __init__(
        self,
        lanes: StoreLanes,
        ownership: Ownership,
        intake: Intake,
        consumer: RecordConsumer,
        *,
        steps: BatchSteps,
        limits: Limits,
        stats: WorkerStats,
        on_committed: Callable[[Planned], None],
        clock: Callable[[], float],
    ) -> None:
        self._lanes = lanes
        self._ownership = ownership
        self._intake = intake
        self._consumer = consumer
        self._steps = steps
        self._limits = limits
        self._stats = stats
        self._on_committed = on_committed
        self._clock = clock
        self.unsynced = False
        self.writes_failing = False
        self.detached = False
        # A batch whose commit outcome is unknown until the stored offsets can be read.
        self._doubt: Planned | None = None
        self._polled_at = 0.0
        # Places (Citus workers, tables by bucket) that stopped answering, with their owned
        # partitions, which wait paused while the other places' go on; and when to try again.
        self._away: dict[object, list[TP]] = {}
        self._away_pace = Availability(clock)

    # -- a batch not committed -------------------------------------------------------------------

    def hung(self, planned: Planned, error: RuntimeFailure, since: float) -> None:
        """The batch's commit did not answer within the bound: its outcome is unknown."""
        self._lanes.abandon_write()
        # The commit has hung since it was submitted: the outage began then.
        self._lanes.availability.failed(since=since)
        self.in_doubt(planned, error)

    def in_doubt(self, planned: Planned, error: RuntimeFailure) -> None:
        """The batch may or may not have committed: found out from the stored offsets."""
        self._stats.rejected_batches += 1
        self._lanes.availability.failed()
        self.writes_failing = True
        log.warning(
            "batch of %d records: commit outcome unknown (%s); reading the stored offsets",
            planned.batch.size,
            error,
        )
        self.resync(in_doubt=planned)

    def rejected(self, planned: Planned, error: RuntimeFailure) -> None:
        """The batch was not committed (fenced or failed; not fatal)."""
        size = planned.batch.size
        self._stats.rejected_batches += 1
        if error.kind is Failure.FENCED:
            log.warning("batch of %d records not committed: fenced (%s); resyncing", size, error)
        elif self.set_aside(planned.batch.last, error, f"batch of {size} records not committed"):
            pass
        else:
            self._lanes.availability.failed()
            self.writes_failing = True
            log.warning("batch of %d records not committed (%s); resyncing", size, error)
        self.resync()

    # -- one place away --------------------------------------------------------------------------

    def set_aside(self, tps: Iterable[TP], error: RuntimeFailure, what: str) -> bool:
        """Whether only the failed batch's place waits: its partitions are paused, set aside.

        With tables distributed by bucket each batch is one place's (one Citus worker's), so a
        batch that failed there says nothing of the other places: their partitions go on, and
        the place's wait paused until a read of their stored positions there succeeds
        (:meth:`bring_back`). Not when no other place is left: the database as a whole is then
        what fails, and the replica's partitions go back to the group after the bound as ever.
        """
        intake = self._intake
        failed = {intake.place(tp) for tp in tps}
        if len(failed) != 1:
            return False
        (place,) = failed
        if place is None:
            return False
        present = [tp for tp in self._ownership.owned if tp not in intake.away]
        partitions = sorted(tp for tp in present if intake.place(tp) == place)
        if not partitions or len(partitions) == len(present):
            return False
        self._away[place] = partitions
        intake.away.update(partitions)
        self._consumer.pause(partitions)
        self._away_pace.failed(back_off=True)
        self._stats.partitions_away = len(intake.away)
        log.warning(
            "%s (%s): partitions %s, whose rows live on %s, wait until it answers; the others "
            "go on",
            what,
            error,
            partitions,
            place,
        )
        return True

    def _read(self, tps: list[TP]) -> dict[TP, tuple[int, int | None]]:
        return dict(self._lanes.control.read_offsets(tps))

    @property
    def away(self) -> bool:
        """Whether some place's partitions wait set aside, and a try to bring them back is due."""
        return bool(self._away) and self._away_pace.may_try()

    def bring_back(self) -> None:
        """Reads each waiting place's stored positions; those it answers for go on from there."""
        lanes = self._lanes
        owned = self._ownership.owned
        intake = self._intake
        for place, waiting in list(self._away.items()):
            tps = [tp for tp in waiting if tp in owned]
            try:
                stored = lanes.on_control(functools.partial(self._read, tps), "read offsets")
            except RuntimeFailure as e:
                if e.kind is Failure.FATAL:
                    raise
                self._away_pace.failed(back_off=True)
                log.info("the partitions whose rows live on %s still wait (%s)", place, e)
                continue
            del self._away[place]
            intake.away.difference_update(waiting)
            lost = []
            for tp in tps:
                epoch, nxt = stored.get(tp, (None, None))
                if epoch != owned[tp].epoch:
                    lost.append(tp)
                    continue
                owned[tp].next_offset = nxt
                self._consumer.seek(tp, nxt)
            self._consumer.resume([tp for tp in tps if tp not in lost])
            self._fenced(lost)
            log.warning(
                "%s answers again: partitions %s go on from their stored positions",
                place,
                sorted(set(tps) - set(lost)),
            )
        self._stats.partitions_away = len(intake.away)
        if not self._away:
            self._away_pace.succeeded()

    # -- records the database refuses ------------------------------------------------------------

    def isolate(self, batch: Batch) -> bool:
        """Dead-letters the records the database refuses, commits the rest of the batch."""
        lanes = self._lanes
        steps = self._steps
        # Offsets expect what the failed batch expected (nothing of it was committed), under
        # the epochs it had: not this replica's ownership now, which a revocation since may
        # have changed (the epoch check then refuses the write, as for any stale batch).
        positions = {(e.topic, e.partition): Owned(e.epoch, e.expected) for e in batch.offsets}

        def attempt(decoded: list[Decoded], dry_run: bool, park: Mapping[SagaKey, str]) -> WriteSet:
            part = steps.batch(decoded, positions)
            ws = steps.apply(part, park=park)
            lanes.on_write(
                lambda: lanes.store.write(ws, part.offsets, dry_run=dry_run), "batch write"
            )
            return ws

        try:
            ws = isolate_refused(
                list(batch.decoded), attempt, between=self._keep_polling, sagas_of=self._sagas_of
            )
        except RuntimeFailure as e:
            if e.kind is Failure.FATAL:
                raise
            log.warning("could not isolate the refused records (%s); resyncing", e)
            lanes.availability.failed()
            self.resync()
            return False
        self._on_committed(Planned(batch, ws))
        # The records read after the failed batch were dropped with the batch planned on it.
        self.resync()
        return False

    def _sagas_of(self, decoded: list[Decoded]) -> set[SagaKey]:
        # An operator's request is not parked behind its saga: a replay the database refuses
        # leaves the saga parked as it was, and the request is dead-lettered with the reason.
        return self._steps.sagas_of([d for d in decoded if not isinstance(d, Operator)])

    def _keep_polling(self) -> None:
        # A search through many refused records takes many trial writes: the consumer polls
        # meanwhile (at most once a second), so the group keeps this replica past its poll
        # interval and its rebalances are served. What it reads is dropped: the resync after
        # the search seeks every partition back to its stored position.
        now = self._clock()
        if now - self._polled_at < 1.0:
            return
        self._polled_at = now
        self._consumer.consume(self._limits.batch_size, 0)

    # -- positions from the store ----------------------------------------------------------------

    def resync(self, in_doubt: Planned | None = None) -> bool:
        """After a failed or in-doubt commit: trust only what the store says was committed.

        An in-doubt batch is kept until the stored offsets can be read, however many tries
        that takes, so its outcome (and its parked sagas' and dead letters' log lines) is
        found rather than forgotten.
        """
        lanes = self._lanes
        owned = self._ownership.owned
        if not self.unsynced:
            self._stats.resyncs += 1
        self.unsynced = True
        self._intake.drop()
        in_doubt = self._doubt = in_doubt or self._doubt
        if self._past_the_bound():
            # The partitions go back first (the caller's next step): another try of a database
            # that has not answered for the whole bound would only hold them longer.
            return False
        # Partitions set aside wait for their place to answer (bring_back), not for this read.
        tps = [tp for tp in owned if tp not in self._intake.away]
        if in_doubt is not None:
            # Its partitions too, should they have been revoked since.
            tps += [tp for tp in in_doubt.batch.last if tp not in owned]
        try:
            stored = lanes.on_control(lambda: lanes.control.read_offsets(tps), "read offsets")
        except RuntimeFailure as e:
            if e.kind is Failure.FATAL:
                raise
            lanes.availability.failed(back_off=True)
            if in_doubt is not None:
                log.warning(
                    "batch of %d records: outcome still unknown (%s)", in_doubt.batch.size, e
                )
            else:
                log.warning("could not read the stored offsets (%s); trying again", e)
            return False
        self._doubt = None
        if in_doubt is not None:
            committed = all(
                stored.get((o.topic, o.partition)) == (o.epoch, o.next_offset)
                for o in in_doubt.batch.offsets
            )
            # A partition claimed by another replica since may have moved past where the batch
            # left it, or past where it started: the offsets no longer tell (found by the
            # simulation, tests/sim). Its effects stand if it committed; if not, the new owner
            # applies its records. Said so, rather than a guess, and counted
            # (saga_batches_outcome_unknown_total).
            moved = sorted(
                (o.topic, o.partition)
                for o in in_doubt.batch.offsets
                if stored.get((o.topic, o.partition), (None, None))[0] != o.epoch
            )
            if moved and not committed:
                self._stats.doubts_unresolved += 1
                log.warning(
                    "batch of %d records: outcome not known: %s changed owner meanwhile (its "
                    "effects stand if it committed; if not, the new owner applies its records)",
                    in_doubt.batch.size,
                    moved,
                )
            else:
                log.warning(
                    "batch of %d records: outcome found: %s",
                    in_doubt.batch.size,
                    "committed" if committed else "not committed",
                )
            if committed:
                self._on_committed(in_doubt)
        self.unsynced = False
        if not self.writes_failing:
            # Reads that work end an outage, unless commits are what fails: then only a commit
            # does, so a replica that reads but cannot commit still gives its partitions back.
            lanes.availability.succeeded()
        lost = []
        for tp in tps:
            epoch, nxt = stored.get(tp, (None, None))
            if tp not in owned:
                continue  # revoked meanwhile
            if epoch != owned[tp].epoch:
                lost.append(tp)
                continue
            owned[tp].next_offset = nxt
            self._consumer.seek(tp, nxt)
        self._fenced(lost)
        return True

    def check_fences(self) -> None:
        """Reads the owned partitions' epochs; gives up (and claims again) those bumped since.

        A partition's owner learns that another replica's claim fenced it when it commits
        there; one with no input since never would, and its outbox rows, fenced as well, would
        wait unpublished until the next input (found by the simulation, tests/sim: a replica
        paused past its session claimed a partition of its stale assignment).
        """
        owned = self._ownership.owned
        if not owned:
            return
        lanes = self._lanes
        tps = [tp for tp in owned if tp not in self._intake.away]
        try:
            stored = lanes.on_control(lambda: lanes.control.read_offsets(tps), "read offsets")
        except RuntimeFailure as e:
            if e.kind is Failure.FATAL:
                raise
            return  # the next batch, or the next check, finds out
        self._fenced(
            [tp for tp in tps if tp in owned and stored.get(tp, (None,))[0] != owned[tp].epoch]
        )

    def _fenced(self, lost: list[TP]) -> None:
        if not lost:
            return
        for tp in lost:
            del self._ownership.owned[tp]
        self._ownership.publish()
        log.warning("fenced out of %s: another replica owns them now", sorted(lost))
        self._consumer.pause(lost)
        # Still assigned here, they are claimed again a little later unless the group takes
        # them away first: the claim that fenced this replica may have been a zombie's (a
        # replica paused past its session claims the partitions it had been waiting for
        # before its next poll tells it they are gone), and no rebalance would then ever
        # give them back (found by the simulation, tests/sim).
        self._ownership.unclaimed.update(lost)
        self._ownership.claim_after = self._clock() + CLAIM_RETRY

    # -- an outage -------------------------------------------------------------------------------

    def _past_the_bound(self) -> bool:
        return (
            not self.detached
            and self._lanes.availability.down_for() >= self._limits.unavailable_timeout
        )

    def give_back_if_unavailable(self) -> None:
        """Gives the partitions back to the group once the database has been away the bound."""
        if not self._past_the_bound():
            return
        down_for = self._lanes.availability.down_for()
        log.warning(
            "the database has been unavailable for %.0f s: giving this replica's partitions "
            "back to the group until it answers again",
            down_for,
        )
        self.detached = True
        self._ownership.clear()
        self._away.clear()
        self._intake.away.clear()
        self._stats.partitions_away = 0
        self._intake.drop()
        self._consumer.leave()

    def step_detached(self) -> int:
        """One poll while the partitions are given back: rejoins once the database answers."""
        lanes = self._lanes
        consumer = self._consumer
        # Serves the group's callbacks (the revocation) while away; nothing is assigned.
        consumer.consume(self._limits.batch_size, self._limits.batch_timeout)
        if not lanes.availability.may_try():
            return 0
        if self._doubt is not None:
            # A batch whose commit outcome is still unknown is resolved by the read that shows
            # the database answers; rejoining without it would forget it (and its log lines).
            if not self.resync():
                return 0
        else:
            try:
                lanes.on_control(lambda: lanes.control.read_offsets([]), "probe")
            except RuntimeFailure as e:
                if e.kind is Failure.FATAL:
                    raise
                lanes.availability.failed(back_off=True)
                return 0
        log.warning("the database answers again: rejoining the group")
        self.detached = False
        self.unsynced = False
        lanes.availability.succeeded()
        consumer.rejoin()
        return 0
