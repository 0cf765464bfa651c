"""The growth watch: notices input topics that grew and tells the consumer which partitions wait.

A loop of its own (``step()`` is one round) reads the input topics' partition counts from the
cluster, records a new count once for the whole consumer group (with the barrier of
:mod:`processor.engine.growth`), takes the old partitions' high watermarks once the barrier time
has come, and works out which new partitions are released. The other loops only read what the
last round published, so none of them ever waits on the cluster or the database for it:

- the worker asks :meth:`GrowthWatch.held` before claiming an assigned partition;
- the deadline poller asks :meth:`GrowthWatch.route` where a saga's fired record goes now;
- the relay may ask :meth:`GrowthWatch.moved_from` which old partition a new one took over.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from processor.engine import growth as rules
from processor.engine.growth import Growth, GrowthState
from processor.engine.partitioner import Partitioner
from processor.errors import Failure, RuntimeFailure
from processor.observe.repeats import RepeatedWarning
from processor.ports import TP, GrowthStore, TopicMetadata
from processor.runtime.heartbeat import beat

__all__ = ["GrowthWatch"]

log = logging.getLogger(__name__)
# How long after a growth passed its barrier a new partition's outbox rows still wait behind the
# older rows of the partition it grew from (see moved_from).
RELAY_GUARD = timedelta(minutes=5)

# Seconds between rounds while a barrier is pending: a released partition is claimed this soon.
PENDING_EVERY = 0.5
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
    released: frozenset[TP] = frozenset()


class GrowthWatch:
    """Follows the partition counts of one consumer group's input topics.

    Args:
        store: Known counts and growths (shared by every replica of the group).
        metadata: The cluster's partition counts and high watermarks.
        group_id: The consumer group.
        topics: Its input topics.
        partitioner: The producers' partitioner (for :meth:`route`).
        grace: How long after a growth is noticed producers may still send to old partitions.
        interval: Seconds between two reads of the partition counts.
        monotonic: Elapsed-time clock (tests pass a fake one).

    Attributes:
        wake: Set it to run the next round now (a partition beyond the known count showed up).
    """

    def __init__(
        self,
        store: GrowthStore,
        metadata: TopicMetadata,
        *,
        group_id: str,
        topics: Sequence[str],
        partitioner: Partitioner,
        grace: timedelta,
        interval: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.metadata = metadata
        self.group_id = group_id
        self.topics = list(topics)
        self.partitioner = partitioner
        self.grace = grace
        self.interval = interval
        self._monotonic = monotonic
        self.wake = threading.Event()
        self._view = _View()
        self._lock = threading.Lock()
        # Held partitions this replica asked about, and since when (for the release log line).
        self._since: dict[TP, float] = {}
        # Counts refused (not a multiple), so the error is logged once per count, not per round.
        self._refused: set[tuple[str, int]] = set()
        self._next_metadata = 0.0

    # -- read by the other loops ---------------------------------------------------------------

    def held(self, tp: TP) -> bool:
        """Whether an assigned partition must wait before it is claimed (consumer thread)."""
        view = self._view
        if not view.loaded:
            return True
        if not rules.held(tp, view.counts, view.growths, view.released):
            return False
        with self._lock:
            self._since.setdefault(tp, self._monotonic())
        known = view.counts.get(tp[0])
        if known is None or tp[1] >= known:
            # The group assigned a partition before this watch read the new count: read it now.
            self._next_metadata = 0.0
            self.wake.set()
        return True

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
        """The partition counts producers of ``topic`` may hash keys with now.

        The known count, and while a growth of the topic is recent (see :meth:`moved_from`) the
        counts it grew from: a producer that has not refreshed its metadata still uses those.
        Empty before the first round, or for a topic this watch does not know.
        """
        view = self._view
        known = view.counts.get(topic)
        if known is None:
            return ()
        keep = max(self.grace, RELAY_GUARD)
        olds = sorted(
            {
                g.old_count
                for g in view.growths
                if g.topic == topic and (g.passed_at is None or view.now - g.passed_at < keep)
            },
            reverse=True,
        )
        return (known, *olds)

    def moved_from(self) -> Mapping[TP, TP]:
        """New partition -> the old one its sagas came from, for growths not long passed.

        Covers every growth whose barrier has not passed for all its new partitions, and those
        that passed less than the grace ago.
        """
        view = self._view
        # The relay keeps a new partition's rows behind the old partition's older rows for a
        # while after the barrier: the old owner's relay may lag behind its worker.
        return rules.moved_from(view.growths, view.now, max(self.grace, RELAY_GUARD))

    # -- one round -----------------------------------------------------------------------------

    def step(self) -> float:
        """One round; returns how long to wait before the next.

        Raises:
            RuntimeFailure: The store or the cluster failed (``Retryable`` when transient).
        """
        now_m = self._monotonic()
        state = self.store.load(self.group_id)
        if now_m >= self._next_metadata or not self._view.loaded:
            self._next_metadata = now_m + self.interval
            observed = self.metadata.partition_counts(self.topics)
            if self._register(observed, state):
                state = self.store.load(self.group_id)
        if self._take_watermarks(state):
            state = self.store.load(self.group_id)
        released, passed = self._released(state)
        if passed:
            state = self.store.load(self.group_id)
        self._publish(state, released)
        pending = any(g.passed_at is None for g in state.growths)
        return min(self.interval, PENDING_EVERY) if pending else self.interval

    def run(self, stop: threading.Event) -> None:
        """Rounds until ``stop`` is set; transient failures are retried, others propagate."""
        failures = RepeatedWarning(log, "growth watch")
        try:
            while not stop.is_set():
                beat()
                try:
                    wait = self.step()
                    failures.succeeded()
                except RuntimeFailure as e:
                    if e.kind is Failure.FATAL:
                        raise
                    failures.failed("growth watch retrying after: %s", e)
                    wait = RETRY_PAUSE
                self.wake.wait(wait)
                self.wake.clear()
        finally:
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
            if self.store.grow(self.group_id, topic, known, count, self.grace):
                log.info(
                    "growth noticed: topic %s grew from %d to %d partitions; new partitions "
                    "wait at least %.0f s for the old ones",
                    topic,
                    known,
                    count,
                    self.grace.total_seconds(),
                )
            changed = True
        return changed

    def _take_watermarks(self, state: GrowthState) -> bool:
        taken = False
        for g in state.growths:
            if g.passed_at is not None or g.watermarks is not None or state.now < g.barrier_at:
                continue
            # Read after the barrier time (the store's clock said so above): every record sent
            # to an old partition before producers switched lies below these.
            marks = self.metadata.high_watermarks(g.topic, range(g.old_count))
            if self.store.store_watermarks(self.group_id, g.topic, g.new_count, marks):
                log.info(
                    "growth barrier taken: topic %s (%d -> %d), old partitions' watermarks %s",
                    g.topic,
                    g.old_count,
                    g.new_count,
                    dict(sorted(marks.items())),
                )
            taken = True
        return taken

    def _released(self, state: GrowthState) -> tuple[frozenset[TP], bool]:
        """New partitions whose barrier passed, and whether a whole growth passed."""
        pending = [g for g in state.growths if g.passed_at is None and g.watermarks is not None]
        if not pending:
            return frozenset(), False
        committed = self.store.committed(self.group_id, sorted({g.topic for g in pending}))
        released: set[TP] = set()
        passed = False
        for g in pending:
            offsets = {p: n for (t, p), n in committed.items() if t == g.topic}
            free = {
                (g.topic, q)
                for q in g.new_partitions()
                if rules.barrier(g, q, state.now, offsets) is None
            }
            released |= free
            if len(free) == g.new_count - g.old_count:
                self.store.mark_passed(self.group_id, g.topic, g.new_count)
                passed = True
                log.info(
                    "growth barrier passed: topic %s (%d -> %d), every new partition released",
                    g.topic,
                    g.old_count,
                    g.new_count,
                )
        return frozenset(released), passed

    def _publish(self, state: GrowthState, released: frozenset[TP]) -> None:
        original = rules.originals(state)
        view = _View(True, state.now, dict(state.counts), original, state.growths, released)
        self._view = view
        with self._lock:
            waited = {
                tp: since
                for tp, since in self._since.items()
                if not rules.held(tp, view.counts, view.growths, view.released)
            }
            for tp in waited:
                del self._since[tp]
        now_m = self._monotonic()
        for (topic, partition), since in sorted(waited.items()):
            log.info(
                "partition %s/%d released after a growth (waited %.1f s)",
                topic,
                partition,
                now_m - since,
            )
