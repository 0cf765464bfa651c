"""Online growth of input topics: the rules, the growth watch, and the worker's waits.

The rules are pure functions; the watch runs over an in-memory store and cluster with one fake
clock (the "database's" and the elapsed-time clock), so nothing waits on time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from processor._engine import growth as rules
from processor._engine.growth import Growth
from processor._engine.partitioner import partition_for
from processor._errors import Retryable, RuntimeFailure
from processor._memory.growth import MemoryGrowthStore
from processor._ports import TP
from processor._runtime.growth import GrowthWatch
from tests.support.harness import wait_until
from tests.unit.test_worker import (
    P0,
    Rig,
    debited,
    requested,
    rig,  # noqa: F401 - the worker fixture
    rigged,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
TOPIC = "in"


def growth(old: int = 6, new: int = 12) -> Growth:
    return Growth(topic=TOPIC, old_count=old, new_count=new, noticed_at=T0)


# -- the rules ------------------------------------------------------------------------------------


def test_only_growth_to_a_multiple_can_be_followed() -> None:
    assert rules.growth_problem(TOPIC, 6, 12) is None
    assert rules.growth_problem(TOPIC, 6, 18) is None
    problem = rules.growth_problem(TOPIC, 6, 8)
    assert problem is not None
    assert "'in' grew from 6 to 8" in problem
    assert "e.g. 12" in problem
    assert "cannot shrink" in (rules.growth_problem(TOPIC, 6, 3) or "")


def test_a_new_partitions_keys_may_arrive_on_the_partition_of_every_earlier_count() -> None:
    once = [growth()]
    assert rules.ancestors(once, TOPIC, 7) == (1,)
    assert rules.ancestors(once, TOPIC, 6) == (0,)
    assert rules.ancestors(once, TOPIC, 5) == ()  # old partitions follow nothing
    assert rules.ancestors(once, "other", 7) == ()
    twice = [growth(), growth(12, 24)]
    assert rules.ancestors(twice, TOPIC, 20) == (2, 8)
    assert rules.ancestors(twice, TOPIC, 14) == (2,)  # 14 % 12 = 2 = 14 % 6
    assert rules.ancestors(twice, TOPIC, 8) == (2,)
    assert rules.ancestors(twice, TOPIC, 3) == ()


def test_a_new_partition_follows_once_every_ancestor_is_consumed_to_its_watermark() -> None:
    assert not rules.follows({1: 10}, {1: 9})
    assert not rules.follows({1: 10}, {})
    assert not rules.follows({1: 10}, {1: None})
    assert rules.follows({1: 10}, {1: 10})
    assert rules.follows({1: 10}, {1: 11})
    # An empty ancestor holds nothing back, consumed or not.
    assert rules.follows({0: 0}, {})
    assert not rules.follows({2: 5, 8: 7}, {2: 5, 8: 6})
    assert rules.follows({2: 5, 8: 7}, {2: 5, 8: 7, 3: 0})


def test_which_assigned_partitions_are_held() -> None:
    counts = {TOPIC: 12}
    assert rules.held(("other", 0), counts)  # count not known yet
    assert rules.held((TOPIC, 12), counts)  # beyond the known count
    assert not rules.held((TOPIC, 5), counts)
    assert not rules.held((TOPIC, 6), counts)  # a new partition is claimed at once


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
    assert w.counts(TOPIC) == (6,)


def test_a_growth_is_recorded_once_and_its_new_partitions_are_claimed_at_once(
    store: MemoryGrowthStore,
    cluster: MemoryCluster,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="processor._runtime.growth")
    a, b = watch(store, cluster, clock), watch(store, cluster, clock)
    a.step()
    b.step()
    cluster.counts[TOPIC] = 12
    # A partition beyond the known count wakes the watch at once, and reads the count now.
    assert a.held((TOPIC, 7))
    assert a.wake.is_set()
    clock.t = 1.0
    assert a.step() == 5.0
    clock.t = 2.0
    b.step()
    assert len(store.growths) == 1
    [g] = store.growths.values()
    assert (g.old_count, g.new_count) == (6, 12)
    assert [r.getMessage() for r in caplog.records if "growth noticed" in r.getMessage()] == [
        "growth noticed: topic in grew from 6 to 12 partitions; a new partition's records "
        "wait until the one it grew from is consumed past them"
    ]
    assert not a.held((TOPIC, 7))
    assert any(
        "partition in/7 of a grown topic claimed (waited 1.0 s" in r.getMessage()
        for r in caplog.records
    )
    assert a.ancestors((TOPIC, 7)) == (1,)
    clock.t = 6.0
    b.step()
    assert b.ancestors((TOPIC, 11)) == (5,)
    # Producers that never refreshed still hash with 6: their records are not off-partition.
    assert a.counts(TOPIC) == (12, 6)
    clock.t = 10_000.0
    a.step()
    assert a.counts(TOPIC) == (12, 6)


def test_a_follow_round_clears_what_was_read_before_its_watermarks_were_taken(
    store: MemoryGrowthStore, cluster: MemoryCluster, clock: Clock
) -> None:
    w = watch(store, cluster, clock)
    w.step()
    cluster.counts[TOPIC] = 24
    store.counts[("g", TOPIC)] = 6
    # 6 -> 12 -> 24 recorded as two growths, as replicas that saw both would.
    store.grow("g", TOPIC, 6, 12)
    store.grow("g", TOPIC, 12, 24)
    clock.t = 10.0
    w.step()
    assert w.ancestors((TOPIC, 20)) == (2, 8)
    assert w.cleared((TOPIC, 20)) == float("-inf")
    stopped = threading.Event()
    stopped.set()  # one look at the positions per round, no waiting
    assert not w.follow(stopped)  # nothing wanted

    cluster.marks = {(TOPIC, 2): 40, (TOPIC, 8): 70}
    store.offsets = {("g", TOPIC, 2): 40, ("g", TOPIC, 8): 69}
    w.want((TOPIC, 20))
    w.want((TOPIC, 7))
    clock.t = 11.0
    assert w.follow(stopped)
    # 7 follows 1, which is empty; 20 waits for 8, one record short of its watermark.
    assert w.cleared((TOPIC, 7)) == 11.0
    assert w.cleared((TOPIC, 20)) == float("-inf")
    # Still wanted: the next round takes the watermarks again.
    cluster.marks[(TOPIC, 8)] = 75
    store.offsets[("g", TOPIC, 8)] = 70
    clock.t = 12.0
    assert w.follow(stopped)
    assert w.cleared((TOPIC, 20)) == float("-inf")
    store.offsets[("g", TOPIC, 8)] = 75
    clock.t = 13.0
    assert w.follow(stopped)
    assert w.cleared((TOPIC, 20)) == 13.0
    assert not w.follow(stopped)


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
    assert w.counts(TOPIC) == (6,)


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


def test_a_held_partition_is_not_claimed_or_read_until_released() -> None:
    held = {P0}
    with rigged(gate=lambda tp: tp in held) as rig:  # noqa: F811
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


class Follow:
    """The growth watch as the worker sees it: P1 follows P0; clearances set by the test."""

    def __init__(self) -> None:
        self.until = float("-inf")
        self.wanted: list[TP] = []

    def ancestors(self, tp: TP) -> tuple[int, ...]:
        return (0,) if tp == P1 else ()

    def cleared(self, tp: TP) -> float:
        return self.until

    def want(self, tp: TP) -> None:
        self.wanted.append(tp)


P1 = (P0[0], 1)


def test_a_new_partitions_records_wait_until_cleared_and_go_in_order() -> None:
    follow = Follow()
    with rigged(follow=follow) as rig:  # noqa: F811
        rig.consumer.assign([P0, P1])
        rig.send(P1, requested("t1"), "m1")
        rig.send(P0, requested("t0"), "m0")
        rig.step()
        # The old partition goes on; the new one's record waits, and a round is asked for.
        assert rig.applied("t0") == ["m0"]
        assert rig.applied("t1") == []
        assert follow.wanted == [P1]
        assert rig.tables.offsets[P1] == (1, None)
        # Read later than the clearance: still waits, with the earlier one, in order.
        rig.send(P1, debited("t1"), "m2")
        rig.step()
        assert rig.applied("t1") == []
        follow.until = time.monotonic()
        rig.send(P1, debited("t1"), "m3")
        rig.step()
        # The two read before the clearance go; the one read after it waits again.
        assert rig.applied("t1") == ["m1", "m2"]
        assert rig.tables.offsets[P1] == (1, 2)
        follow.until = time.monotonic()
        rig.step()
        assert rig.applied("t1") == ["m1", "m2", "m3"]
        assert rig.tables.offsets[P1] == (1, 3)
        assert rig.worker.stats.growth_waiting == 0


def test_a_new_partition_holding_a_batch_is_paused_until_its_records_go() -> None:
    follow = Follow()
    with rigged(follow=follow) as rig:  # noqa: F811
        rig.consumer.assign([P1])
        for i in range(rig.worker.batch_size + 5):
            rig.send(P1, requested(f"t{i}"), f"m{i}")
        rig.step()
        assert P1 in rig.consumer.paused()
        assert rig.tables.offsets[P1] == (1, None)
        follow.until = time.monotonic()
        rig.step()
        assert rig.tables.offsets[P1] == (1, rig.worker.batch_size)
        assert P1 not in rig.consumer.paused()
        follow.until = float("inf")
        rig.step()
        assert rig.tables.offsets[P1] == (1, rig.worker.batch_size + 5)


def test_a_resync_drops_the_waiting_records_and_reads_them_again() -> None:
    follow = Follow()
    with rigged(follow=follow) as rig:  # noqa: F811
        rig.consumer.assign([P1])
        for i in range(rig.worker.batch_size):
            rig.send(P1, requested(f"t{i}"), f"m{i}")
        rig.step()
        assert P1 in rig.consumer.paused()
        rig.worker.resync()
        assert P1 not in rig.consumer.paused()
        follow.until = float("inf")
        rig.step()
        rig.step()
        assert rig.tables.offsets[P1] == (1, rig.worker.batch_size)
        assert rig.applied("t0") == ["m0"]


def test_a_partition_ending_in_transaction_markers_is_stored_at_its_end(rig: Rig) -> None:  # noqa: F811
    rig.consumer.assign([P0])
    rig.send(P0, requested("t1"), "m1")
    rig.consumer.append_marker(*P0)
    rig.step()
    rig.step()
    # Past the marker: a new partition following P0 compares this with P0's high watermark.
    assert rig.tables.offsets[P0] == (1, 2)
    assert rig.applied("t1") == ["m1"]
    rig.send(P0, debited("t1"), "m2")
    rig.consumer.append_marker(*P0)
    rig.consumer.append_marker(*P0)
    rig.step()
    rig.step()
    assert rig.tables.offsets[P0] == (1, 5)
    assert rig.applied("t1") == ["m1", "m2"]


def test_an_end_is_not_stored_past_records_that_still_wait() -> None:
    follow = Follow()
    with rigged(follow=follow) as rig:  # noqa: F811
        rig.consumer.assign([P1])
        rig.send(P1, requested("t1"), "m1")
        rig.consumer.append_marker(*P1)
        rig.step()
        rig.step()
        assert rig.tables.offsets[P1] == (1, None)
        follow.until = float("inf")
        rig.step()
        rig.step()
        assert rig.applied("t1") == ["m1"]
        assert rig.tables.offsets[P1] == (1, 2)


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
    caplog.set_level(logging.WARNING, logger="processor._runtime.growth")
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


def test_the_retired_growth_grace_setting_is_ignored_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from processor.settings import load_settings

    monkeypatch.setenv("SAGA_DATABASE__URL", "postgresql://unused")
    monkeypatch.setenv("SAGA_CONSUMER__GROWTH_GRACE", "5m")
    with caplog.at_level(logging.WARNING, logger="processor.settings"):
        load_settings()
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("SAGA_CONSUMER__GROWTH_GRACE is ignored: new partitions no longer")


@pytest.mark.parametrize("store_away", [False, True])
def test_the_first_round_is_marked_ended_whether_or_not_it_read_the_counts(
    store: MemoryGrowthStore,
    cluster: MemoryCluster,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
    store_away: bool,
) -> None:
    # The consumer's first poll waits for this mark (Processor.run): a store that is away must
    # not hold it up for longer than one try.
    w = watch(store, cluster, clock)
    if store_away:

        def away(group_id: str) -> None:
            raise Retryable("connection refused")

        monkeypatch.setattr(store, "load", away)
    stop = threading.Event()
    runner = threading.Thread(target=w.run, args=(stop,))
    runner.start()
    try:
        assert w.first_round.wait(5)
        assert w.held((TOPIC, 0)) is store_away
    finally:
        stop.set()
        w.wake.set()
        runner.join(5)
    assert not runner.is_alive()
