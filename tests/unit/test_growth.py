"""Online growth of input topics: the barrier rules, the growth watch, and gated claims.

The rules are pure functions; the watch runs over an in-memory store and cluster with one fake
clock (the "database's" and the elapsed-time clock), so barriers pass without waiting.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from processor.engine import growth as rules
from processor.engine.growth import Growth
from processor.engine.partitioner import partition_for
from processor.errors import Retryable, RuntimeFailure
from processor.memory.growth import MemoryGrowthStore
from processor.ports import TP
from processor.runtime.growth import RELAY_GUARD, GrowthWatch
from tests.support.harness import wait_until
from tests.unit.test_worker import (
    P0,
    Rig,
    requested,
    rig,  # noqa: F401 - the worker fixture
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
GRACE = timedelta(seconds=30)
TOPIC = "in"


def growth(**kw: object) -> Growth:
    base: dict[str, object] = {
        "topic": TOPIC,
        "old_count": 6,
        "new_count": 12,
        "noticed_at": T0,
        "barrier_at": T0 + GRACE,
    }
    base.update(kw)
    return Growth(**base)  # type: ignore[arg-type]


# -- the rules ------------------------------------------------------------------------------------


def test_only_growth_to_a_multiple_can_be_followed() -> None:
    assert rules.growth_problem(TOPIC, 6, 12) is None
    assert rules.growth_problem(TOPIC, 6, 18) is None
    problem = rules.growth_problem(TOPIC, 6, 8)
    assert problem is not None
    assert "'in' grew from 6 to 8" in problem
    assert "e.g. 12" in problem
    assert "cannot shrink" in (rules.growth_problem(TOPIC, 6, 3) or "")


def test_a_new_partition_waits_for_the_barrier_time_then_the_watermarks() -> None:
    g = growth()
    assert "until" in (rules.barrier(g, 7, T0 + GRACE / 2, {1: 100}) or "")
    assert "not taken" in (rules.barrier(g, 7, T0 + GRACE, {1: 100}) or "")


def test_a_new_partition_waits_until_its_old_partition_is_consumed_to_the_watermark() -> None:
    g = growth(watermarks={p: 10 * p for p in range(6)})
    now = T0 + GRACE
    # Partition 7 took its sagas from 7 % 6 = 1, whose watermark is 10.
    assert "partition 1 is consumed up to 9, not yet to 10" in (
        rules.barrier(g, 7, now, {1: 9}) or ""
    )
    assert "up to None" in (rules.barrier(g, 7, now, {}) or "")
    assert rules.barrier(g, 7, now, {1: 10}) is None
    assert rules.barrier(g, 7, now, {1: 11}) is None
    # Partition 6's old partition 0 was empty: nothing to wait for, even unconsumed.
    assert rules.barrier(g, 6, now, {}) is None
    # Another old partition's progress does not count.
    assert rules.barrier(g, 8, now, {1: 100, 2: 19}) is not None


def test_a_passed_growth_holds_nothing() -> None:
    g = growth(passed_at=T0 + GRACE)
    assert rules.barrier(g, 7, T0, {}) is None
    assert not rules.held((TOPIC, 7), {TOPIC: 12}, [g], frozenset())


def test_which_assigned_partitions_are_held() -> None:
    g = growth(watermarks={p: 1 for p in range(6)})
    counts = {TOPIC: 12}
    assert rules.held(("other", 0), counts, [g], frozenset())  # count not known yet
    assert rules.held((TOPIC, 12), counts, [g], frozenset())  # beyond the known count
    assert not rules.held((TOPIC, 5), counts, [g], frozenset())  # old partitions never wait
    assert rules.held((TOPIC, 6), counts, [g], frozenset())
    assert not rules.held((TOPIC, 6), counts, [g], frozenset({(TOPIC, 6)}))
    assert not rules.held((TOPIC, 0), {TOPIC: 6}, [], frozenset())


def test_a_moved_sagas_record_is_routed_to_its_new_partition() -> None:
    moved = next(k for i in range(100) if partition_for(k := f"s{i}".encode(), 12, "murmur2") >= 6)
    old = partition_for(moved, 6, "murmur2")
    new = partition_for(moved, 12, "murmur2")
    assert rules.route(moved, old, 12, 6, "murmur2") == new
    assert rules.route(moved, old, None, None, "murmur2") == old
    assert rules.route(moved, old, 6, 6, "murmur2") == old
    # Stored where the configured partitioner would not put it: the producers use another one,
    # and the stored partition is the better guess.
    assert rules.route(moved, (old + 1) % 6, 12, 6, "murmur2") == (old + 1) % 6


def test_moved_from_maps_new_partitions_to_old_ones_until_well_past() -> None:
    pending = growth()
    assert rules.moved_from([pending], T0, GRACE) == {
        (TOPIC, q): (TOPIC, q % 6) for q in range(6, 12)
    }
    passed = growth(passed_at=T0)
    assert rules.moved_from([passed], T0 + GRACE / 2, GRACE) != {}
    assert rules.moved_from([passed], T0 + GRACE, GRACE) == {}


# -- the watch ------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> datetime:
        return T0 + timedelta(seconds=self.t)

    def monotonic(self) -> float:
        return self.t


class MemoryCluster:
    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.marks: dict[TP, int] = {}
        self.watermark_reads = 0

    def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        return {t: self.counts[t] for t in topics if t in self.counts}

    def high_watermarks(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        self.watermark_reads += 1
        return {p: self.marks.get((topic, p), 0) for p in partitions}

    def close(self) -> None:
        pass


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryGrowthStore:
    return MemoryGrowthStore(clock.now)


@pytest.fixture
def cluster() -> MemoryCluster:
    return MemoryCluster({TOPIC: 6})


def watch(store: MemoryGrowthStore, cluster: MemoryCluster, clock: Clock) -> GrowthWatch:
    return GrowthWatch(
        store,
        cluster,
        group_id="g",
        topics=[TOPIC],
        partitioner="murmur2",
        grace=GRACE,
        interval=5.0,
        monotonic=clock.monotonic,
    )


def test_everything_waits_until_the_first_round_then_the_count_is_the_baseline(
    store: MemoryGrowthStore, cluster: MemoryCluster, clock: Clock
) -> None:
    w = watch(store, cluster, clock)
    assert w.held((TOPIC, 0))
    assert w.step() == 5.0
    assert store.counts == {("g", TOPIC): 6}
    assert not any(w.held((TOPIC, p)) for p in range(6))
    assert w.moved_from() == {}


def test_a_growth_is_recorded_once_and_its_new_partitions_wait_for_the_barrier(
    store: MemoryGrowthStore,
    cluster: MemoryCluster,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="processor.runtime.growth")
    a, b = watch(store, cluster, clock), watch(store, cluster, clock)
    a.step()
    b.step()
    cluster.counts[TOPIC] = 12
    cluster.marks = {(TOPIC, p): 100 + p for p in range(6)}
    store.offsets = {("g", TOPIC, p): 50 for p in range(6)}
    # A partition beyond the known count wakes the watch at once.
    assert a.held((TOPIC, 7))
    assert a.wake.is_set()
    clock.t = 1.0
    assert a.step() == 0.5  # a barrier is pending: short rounds
    clock.t = 2.0
    b.step()
    assert len(store.growths) == 1
    [g] = store.growths.values()
    assert (g.old_count, g.new_count, g.barrier_at) == (6, 12, T0 + timedelta(seconds=31))
    assert [r.getMessage() for r in caplog.records if "growth noticed" in r.getMessage()] == [
        "growth noticed: topic in grew from 6 to 12 partitions; new partitions wait at least "
        "30 s for the old ones"
    ]
    assert a.held((TOPIC, 7))
    assert not a.held((TOPIC, 1))
    assert a.moved_from()[(TOPIC, 7)] == (TOPIC, 1)

    # Before the barrier time no watermark is read, whatever the offsets.
    store.offsets = {("g", TOPIC, p): 1000 for p in range(6)}
    clock.t = 30.0
    a.step()
    assert cluster.watermark_reads == 0
    assert a.held((TOPIC, 7))

    # At the barrier the watermarks are taken once; records sent later do not move them.
    store.offsets = {("g", TOPIC, p): 50 for p in range(6)}
    clock.t = 31.0
    a.step()
    cluster.marks = {(TOPIC, p): 500 for p in range(6)}
    b.step()
    assert store.growths[("g", TOPIC, 12)].watermarks == {p: 100 + p for p in range(6)}
    assert any("growth barrier taken" in r.getMessage() for r in caplog.records)
    assert a.held((TOPIC, 7))

    # Old partition 1 consumed to its watermark: 7 (= 1 + 6) goes, 8 still waits on 2.
    store.offsets[("g", TOPIC, 1)] = 101
    clock.t = 40.0
    a.step()
    assert not a.held((TOPIC, 7))
    assert a.held((TOPIC, 8))
    released = [r.getMessage() for r in caplog.records if "released" in r.getMessage()]
    assert released == ["partition in/7 released after a growth (waited 40.0 s)"]

    for p in range(6):
        store.offsets[("g", TOPIC, p)] = 100 + p
    clock.t = 41.0
    assert a.step() == 5.0  # passed: back to the normal interval
    assert store.growths[("g", TOPIC, 12)].passed_at == T0 + timedelta(seconds=41)
    assert not any(a.held((TOPIC, q)) for q in range(12))
    b.step()
    assert not b.held((TOPIC, 11))
    assert b.moved_from()[(TOPIC, 11)] == (TOPIC, 5)
    # The relay's guard outlives the grace: the old partition's relay may lag its worker.
    clock.t = 41.0 + GRACE.total_seconds()
    b.step()
    assert b.moved_from()[(TOPIC, 11)] == (TOPIC, 5)
    clock.t = 41.0 + RELAY_GUARD.total_seconds()
    b.step()
    assert b.moved_from() == {}


def test_growth_to_a_count_that_is_not_a_multiple_is_refused_and_logged_once(
    store: MemoryGrowthStore,
    cluster: MemoryCluster,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = watch(store, cluster, clock)
    w.step()
    cluster.counts[TOPIC] = 8
    for t in (10.0, 20.0):
        clock.t = t
        w.step()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "'in' grew from 6 to 8" in errors[0].getMessage()
    assert store.counts[("g", TOPIC)] == 6
    assert w.held((TOPIC, 6))
    assert w.held((TOPIC, 7))
    assert not w.held((TOPIC, 5))


def test_deadlines_of_moved_sagas_are_routed_with_the_known_count(
    store: MemoryGrowthStore, cluster: MemoryCluster, clock: Clock
) -> None:
    w = watch(store, cluster, clock)
    key = next(k for i in range(100) if partition_for(k := f"s{i}".encode(), 12, "murmur2") >= 6)
    old = partition_for(key, 6, "murmur2")
    w.step()
    assert w.route(TOPIC, key, old) == old
    cluster.counts[TOPIC] = 12
    clock.t = 10.0
    w.step()
    assert w.route(TOPIC, key, old) == partition_for(key, 12, "murmur2")


# -- the worker -----------------------------------------------------------------------------------


def test_a_held_partition_is_not_claimed_or_read_until_released(rig: Rig) -> None:  # noqa: F811
    held = {P0}
    rig.worker.gate = lambda tp: tp in held
    rig.send(P0, requested("t1"), "m1")
    rig.consumer.assign([P0])
    assert P0 not in rig.tables.offsets
    assert rig.step() == 0
    assert P0 in rig.consumer.paused()
    assert rig.step() == 0
    assert rig.worker.stats.growth_waiting == 1
    assert rig.applied("t1") == []

    held.clear()
    rig.step()  # claims, seeks and resumes
    rig.step()
    assert rig.tables.offsets[P0] == (1, 1)
    assert rig.applied("t1") == ["m1"]
    assert rig.worker.stats.growth_waiting == 0


class FlakyCluster(MemoryCluster):
    """Fails its first reads as a broker out of reach would, then answers."""

    def __init__(self, counts: dict[str, int], failures: int, error: Exception) -> None:
        super().__init__(counts)
        self.failures = failures
        self.error = error

    def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        if self.failures:
            self.failures -= 1
            raise self.error
        return super().partition_counts(topics)


def test_the_watch_outlives_an_unreachable_cluster_and_dies_of_anything_else(
    store: MemoryGrowthStore, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="processor.runtime.growth")
    flaky = FlakyCluster({TOPIC: 6}, 2, Retryable("cluster out of reach"))
    w = watch(store, flaky, clock)
    stop = threading.Event()
    thread = threading.Thread(target=w.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: not w.held((TOPIC, 0)), 10, "the first round after two failures")
    finally:
        stop.set()
        w.wake.set()
        thread.join(10)
    assert not thread.is_alive()
    assert flaky.failures == 0
    # The second failure within a second is held back; the recovery says how many there were.
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if "growth watch retrying" in m]) == 1
    assert any("growth watch recovered after 2 failure(s)" in m for m in lines)

    broken = FlakyCluster({TOPIC: 6}, 1, RuntimeFailure("permission denied"))
    with pytest.raises(RuntimeFailure, match="permission denied"):
        watch(store, broken, clock).run(threading.Event())
