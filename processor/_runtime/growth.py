"""The growth watch: notices input topics that grew, and says when a new partition's records may go.

A loop of its own (``step()`` is one round) reads the input topics' partition counts from the
cluster and records a new count once for the whole consumer group. Between rounds it follows
the partitions a growth added (:mod:`processor._engine.growth`): for each one whose records wait
(the worker says so with :meth:`GrowthWatch.want`), it stamps the time, takes the high watermarks
of the partitions a late producer may have sent that partition's keys to, and waits until the
group's stored positions there reach them; every record read before the stamp may then go
(:meth:`GrowthWatch.cleared`). The other loops only read what the last round published, so none
of them ever waits on the cluster or the database for it:

- the worker asks :meth:`GrowthWatch.held` before claiming an assigned partition, and
  :meth:`GrowthWatch.cleared` before applying a record of a grown topic's new partition;
- the deadline poller asks :meth:`GrowthWatch.route` where a saga's fired record goes now;
- the placement check asks :meth:`GrowthWatch.counts` which counts producers may hash with.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from processor._engine import growth as rules
from processor._engine.growth import Growth, GrowthState
from processor._engine.partitioner import Partitioner
from processor._errors import Failure, RuntimeFailure
from processor._observe.repeats import RepeatedWarning
from processor._ports import TP, GrowthStore, TopicMetadata
from processor._runtime.heartbeat import beat

__all__ = ["GrowthWatch"]

log = logging.getLogger(__name__)

# Seconds between reads of the stored positions while a follow round waits for them.
FOLLOW_POLL = 0.02
# A follow round gives up after this long and starts again with fresh watermarks, so that a
# partition that was wanted meanwhile is not kept waiting behind a slow one.
FOLLOW_ROUND = 2.0
# Pause before the next round after the store or the cluster failed.
RETRY_PAUSE = 1.0


@dataclass(frozen=True, slots=True)
class _View:
    """What one round found; replaced whole, so readers on other threads see one round."""

    loaded: bool = False
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    counts: Mapping[str, int] = field(default_factory=dict)
    original: Mapping[str, int] = field(default_factory=dict)
    growths: tuple[Growth, ...] = ()


class GrowthWatch:
    """Follows the partition counts of one consumer group's input topics.

    Args:
        store: Known counts and growths, and the group's stored positions (shared by every
            replica of the group).
        metadata: The cluster's partition counts and high watermarks.
        group_id: The consumer group.
        topics: Its input topics.
        partitioner: The producers' partitioner (for :meth:`route`).
        interval: Seconds between two reads of the partition counts.
        monotonic: Elapsed-time clock (tests pass a fake one); :meth:`cleared` speaks it.

    Attributes:
        wake: Set it to run the next round now (a partition beyond the known count showed up,
            or a new partition's records wait).
        first_round: Set once the first round has ended, the counts read or not (or the loop
            has ended): until the counts are read every partition is held, so the consumer's
            first poll waits for it (:meth:`processor._runtime.processor.Processor.run`).
    """

    def __init__(
        self,
        store: GrowthStore,
        metadata: TopicMetadata,
        *,
        group_id: str,
        topics: Sequence[str],
        partitioner: Partitioner,
        interval: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.metadata = metadata
        self.group_id = group_id
        self.topics = list(topics)
        self.partitioner = partitioner
        self.interval = interval
        self._monotonic = monotonic
        self.wake = threading.Event()
        self.first_round = threading.Event()
        self._view = _View()
        self._lock = threading.Lock()
        # Held partitions this replica asked about, and since when (for the release log line).
        self._since: dict[TP, float] = {}
        # Counts refused (not a multiple), so the error is logged once per count, not per round.
        self._refused: set[tuple[str, int]] = set()
        self._next_metadata = 0.0
        # New partitions whose records wait, and the stamp up to which each one's are cleared.
        self._wanted: set[TP] = set()
        self._cleared: dict[TP, float] = {}

    # -- read by the other loops ---------------------------------------------------------------

    def held(self, tp: TP) -> bool:
        """Whether an assigned partition must wait before it is claimed (consumer thread)."""
        view = self._view
        if not view.loaded:
            return True
        if not rules.held(tp, view.counts):
            return False
        with self._lock:
            self._since.setdefault(tp, self._monotonic())
        # The group assigned a partition before this watch read the new count: read it now.
        self._next_metadata = 0.0
        self.wake.set()
        return True

    def ancestors(self, tp: TP) -> tuple[int, ...]:
        """The partitions of ``tp``'s topic a late producer may send ``tp``'s keys to instead."""
        return rules.ancestors(self._view.growths, tp[0], tp[1])

    def cleared(self, tp: TP) -> float:
        """Records of ``tp`` read at or before this time (this watch's clock) may be applied.

        Only meaningful for a partition with :meth:`ancestors`; minus infinity before its first
        follow round.
        """
        return self._cleared.get(tp, float("-inf"))

    def want(self, tp: TP) -> None:
        """Asks for a follow round of ``tp``: records of it read up to now wait (worker thread)."""
        with self._lock:
            if tp in self._wanted:
                return
            self._wanted.add(tp)
        self.wake.set()

    def route(self, topic: str, key: bytes, stored: int) -> int:
        """The partition a record of the saga keyed ``key`` goes to now (deadline poller).

        Args:
            topic: The saga's input topic.
            key: The saga's key (its id).
            stored: The partition its input was on when the deadline was set.
        """
        view = self._view
        return rules.route(
            key, stored, view.counts.get(topic), view.original.get(topic), self.partitioner
        )

    def counts(self, topic: str) -> tuple[int, ...]:
        """The partition counts producers of ``topic`` may hash keys with: the known one first.

        Every count the topic had: a producer that never refreshed its metadata still uses an
        old one. Empty before the first round, or for a topic this watch does not know.
        """
        view = self._view
        known = view.counts.get(topic)
        if known is None:
            return ()
        olds = sorted({g.old_count for g in view.growths if g.topic == topic}, reverse=True)
        return (known, *olds)

    # -- rounds --------------------------------------------------------------------------------

    def step(self) -> float:
        """One round of the partition counts; returns how long to wait before the next.

        Raises:
            RuntimeFailure: The store or the cluster failed (``Retryable`` when transient).
        """
        now_m = self._monotonic()
        if now_m >= self._next_metadata or not self._view.loaded:
            state = self.store.load(self.group_id)
            observed = self.metadata.partition_counts(self.topics)
            if self._register(observed, state):
                state = self.store.load(self.group_id)
            self._next_metadata = now_m + self.interval
            self._publish(state)
        return max(0.0, self._next_metadata - self._monotonic())

    def follow(self, stop: threading.Event) -> bool:
        """One follow round of the partitions wanted now; False when none was wanted.

        Raises:
            RuntimeFailure: The store or the cluster failed (``Retryable`` when transient).
        """
        with self._lock:
            wanted, self._wanted = self._wanted, set()
        if not wanted:
            return False
        # Stamped before the watermarks are read: a record read before the stamp was appended
        # before them, and so was everything its producer sent to the old partitions earlier.
        stamp = self._monotonic()
        needs = {tp: self.ancestors(tp) for tp in wanted}
        marks: dict[TP, int] = {}
        for topic in sorted({t for t, _ in wanted}):
            olds = sorted({a for (t, _), anc in needs.items() if t == topic for a in anc})
            if olds:
                for p, mark in self.metadata.high_watermarks(topic, olds).items():
                    marks[(topic, p)] = mark
        topics = sorted({t for t, _ in wanted})
        give_up = self._monotonic() + FOLLOW_ROUND
        while True:
            committed = self.store.committed(self.group_id, topics)
            for tp in sorted(needs):
                topic = tp[0]
                mine = {a: marks.get((topic, a), 0) for a in needs[tp]}
                positions = {p: n for (t, p), n in committed.items() if t == topic}
                if rules.follows(mine, positions):
                    self._cleared[tp] = stamp
                    del needs[tp]
            if not needs or stop.is_set() or self._monotonic() >= give_up:
                break
            stop.wait(FOLLOW_POLL)
        if needs:
            # Still waiting: asked again with fresh watermarks in the next round.
            with self._lock:
                self._wanted |= needs.keys()
        return True

    def run(self, stop: threading.Event) -> None:
        """Rounds until ``stop`` is set; transient failures are retried, others propagate."""
        failures = RepeatedWarning(log, "growth watch")
        try:
            while not stop.is_set():
                beat()
                try:
                    wait = self.step()
                    if self.follow(stop):
                        wait = 0.0
                    failures.succeeded()
                except RuntimeFailure as e:
                    if e.kind is Failure.FATAL:
                        raise
                    failures.failed("growth watch retrying after: %s", e)
                    wait = RETRY_PAUSE
                self.first_round.set()
                if wait > 0:
                    self.wake.wait(wait)
                self.wake.clear()
        finally:
            self.first_round.set()
            self.metadata.close()
            self.store.close()

    def _register(self, observed: Mapping[str, int], state: GrowthState) -> bool:
        changed = False
        for topic, count in sorted(observed.items()):
            known = state.counts.get(topic)
            if known is None:
                # First sight of the topic (a new deployment): its count now is the baseline.
                self.store.baseline(self.group_id, topic, count)
                changed = True
                continue
            if count == known:
                continue
            problem = rules.growth_problem(topic, known, count)
            if problem is not None:
                if (topic, count) not in self._refused:
                    self._refused.add((topic, count))
                    log.error("partition count change refused: %s", problem)
                continue
            if self.store.grow(self.group_id, topic, known, count):
                log.info(
                    "growth noticed: topic %s grew from %d to %d partitions; a new partition's "
                    "records wait until the one it grew from is consumed past them",
                    topic,
                    known,
                    count,
                )
            changed = True
        return changed

    def _publish(self, state: GrowthState) -> None:
        original = rules.originals(state)
        view = _View(True, state.now, dict(state.counts), original, state.growths)
        self._view = view
        with self._lock:
            known = {tp: t for tp, t in self._since.items() if not rules.held(tp, view.counts)}
            for tp in known:
                del self._since[tp]
        now_m = self._monotonic()
        for (topic, partition), since in sorted(known.items()):
            log.info(
                "partition %s/%d of a grown topic claimed (waited %.1f s for the new count)",
                topic,
                partition,
                now_m - since,
            )
