"""The deadline poller over in-memory adapters: leadership, fencing, retries, redispatch, sleeps.

One fake clock drives both the store's "database clock" and the poller's elapsed-time clock,
so leases expire without waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from processor._engine.records import OutboxRow
from processor._errors import Retryable, SendFailure
from processor._memory.deadlines import MemoryDeadlineStore
from processor._memory.producer import MemoryRecordProducer
from processor._runtime.hooks import Hooks
from processor._runtime.poller import DeadlinePoller
from processor._wire import HEADER_DEADLINE_ID, HEADER_FENCING_TOKEN, FiredRecord
from processor.settings import DeadlinePollingSettings, DeadlineSettings

TTL = 10.0
REDISPATCH = 30.0
INTERVAL = 5.0
HOUR = timedelta(hours=1)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.start = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.t)

    def monotonic(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


SETTINGS = DeadlineSettings(
    polling=DeadlinePollingSettings(interval=timedelta(seconds=INTERVAL), batch_size=10),
    lease_ttl=timedelta(seconds=TTL),
    redispatch_after=timedelta(seconds=REDISPATCH),
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryDeadlineStore:
    return MemoryDeadlineStore(clock.now)


@pytest.fixture
def producer() -> MemoryRecordProducer:
    return MemoryRecordProducer()


@pytest.fixture
def make(
    store: MemoryDeadlineStore, producer: MemoryRecordProducer, clock: FakeClock
) -> Callable[..., DeadlinePoller]:
    def make(holder: str, hooks: Hooks | None = None) -> DeadlinePoller:
        return DeadlinePoller(
            store,
            producer,
            holder=holder,
            settings=SETTINGS,
            hooks=hooks,
            monotonic=clock.monotonic,
        )

    return make


def _fired(producer: MemoryRecordProducer) -> list[tuple[str, int]]:
    """(deadline id, fencing token) of every acknowledged fired record."""
    return [
        (r.headers[HEADER_DEADLINE_ID], int(r.headers[HEADER_FENCING_TOKEN])) for r in producer.sent
    ]


def _due(store: MemoryDeadlineStore, clock: FakeClock, saga_id: str = "s-1") -> str:
    return store.add("order", saga_id, "timeout", clock.now() - HOUR, topic="orders", partition=2)


def test_only_the_lease_holder_fires(
    make: Callable[..., DeadlinePoller],
    store: MemoryDeadlineStore,
    clock: FakeClock,
    producer: MemoryRecordProducer,
) -> None:
    a, b = make("a"), make("b")
    first = _due(store, clock, "s-1")
    a.step()
    b.step()
    second = _due(store, clock, "s-2")
    b.step()
    assert b.token is None
    assert _fired(producer) == [(first, 1)]
    a.step()
    assert _fired(producer) == [(first, 1), (second, 1)]
    assert (a.fired, b.fired) == (2, 0)


def test_a_fired_record_goes_to_the_sagas_partition_and_parses_back(
    make: Callable[..., DeadlinePoller],
    store: MemoryDeadlineStore,
    clock: FakeClock,
    producer: MemoryRecordProducer,
) -> None:
    did = _due(store, clock)
    make("a").step()
    [record] = producer.sent
    assert (record.topic, record.partition, record.key) == ("orders", 2, b"s-1")
    assert FiredRecord.parse(record.value) == FiredRecord("order", "s-1", did, "timeout", 1)
    assert store.row(did).dispatch_token == 1


def test_an_expired_lease_is_taken_with_a_larger_token(
    make: Callable[..., DeadlinePoller], store: MemoryDeadlineStore, clock: FakeClock
) -> None:
    a, b = make("a"), make("b")
    assert a.acquire() == 1
    clock.advance(TTL - 1)
    assert b.acquire() is None
    assert a.acquire() == 1  # renewed, same token
    clock.advance(TTL - 1)
    assert b.acquire() is None
    clock.advance(2)
    assert b.acquire() == 2
    assert a.acquire() is None
    assert a.token is None
    lease = store.lease
    assert lease is not None
    assert (lease.holder, lease.token) == ("b", 2)


def test_a_paused_ex_leader_cannot_claim_after_losing_the_lease(
    make: Callable[..., DeadlinePoller],
    store: MemoryDeadlineStore,
    clock: FakeClock,
    producer: MemoryRecordProducer,
) -> None:
    a, b = make("a"), make("b")
    old = a.acquire()
    assert old == 1
    # Paused past its lease; another poller takes over before the deadline is even stored.
    clock.advance(TTL + 1)
    assert b.acquire() == 2
    did = _due(store, clock)
    # Waking mid-step, the ex-leader still believes in its token: the claim itself refuses.
    assert a.sweep(old) == 0
    assert producer.sent == []
    assert store.row(did).dispatched_at is None
    assert a.acquire() is None
    assert b.sweep(2) == 1
    assert _fired(producer) == [(did, 2)]


def test_unacknowledged_records_are_unclaimed_and_retried_at_once(
    make: Callable[..., DeadlinePoller],
    store: MemoryDeadlineStore,
    clock: FakeClock,
    producer: MemoryRecordProducer,
) -> None:
    a = make("a")
    lost, kept = _due(store, clock, "s-1"), _due(store, clock, "s-2")
    producer.fail_next(1)
    assert a.step() == 0.0  # no sleep: the failed record is due again
    assert _fired(producer) == [(kept, 1)]
    assert store.row(lost).dispatched_at is None
    assert a.fired == 1
    a.step()
    assert _fired(producer) == [(kept, 1), (lost, 1)]
    assert a.fired == 2


def test_a_client_failure_unclaims_the_whole_sweep(
    make: Callable[..., DeadlinePoller],
    store: MemoryDeadlineStore,
    clock: FakeClock,
    producer: MemoryRecordProducer,
) -> None:
    class Broken(MemoryRecordProducer):
        def send(self, records: Sequence[OutboxRow], timeout: float) -> list[SendFailure]:
            raise Retryable("client failed")

    did = _due(store, clock)
    poller = DeadlinePoller(
        store, Broken(), holder="a", settings=SETTINGS, monotonic=clock.monotonic
    )
    with pytest.raises(Retryable):
        poller.step()
    assert store.row(did).dispatched_at is None


def test_a_dispatch_is_never_sent_again_on_a_timer(
    make: Callable[..., DeadlinePoller],
    store: MemoryDeadlineStore,
    clock: FakeClock,
    producer: MemoryRecordProducer,
) -> None:
    # However long the consumer lags, the record it has not read yet is not multiplied.
    a = make("a")
    did = _due(store, clock)
    a.step()
    for _ in range(40):  # 5 minutes 20 s, each step within the lease
        clock.advance(8)
        a.step()
    assert _fired(producer) == [(did, 1)]


def test_a_dispatch_consumed_without_effect_is_fired_again_once_reset(
    make: Callable[..., DeadlinePoller],
    store: MemoryDeadlineStore,
    clock: FakeClock,
    producer: MemoryRecordProducer,
) -> None:
    a = make("a")
    did = _due(store, clock)
    a.step()
    store.reset(did, token=99)  # another token's reset leaves this dispatch alone
    clock.advance(1)
    a.step()
    assert _fired(producer) == [(did, 1)]
    store.reset(did, token=1)  # the consumer saw token 1's record apply nothing
    clock.advance(1)
    a.step()
    assert _fired(producer) == [(did, 1), (did, 1)]


def test_a_parked_sagas_due_deadline_is_not_fired_until_it_is_active_again(
    make: Callable[..., DeadlinePoller],
    store: MemoryDeadlineStore,
    clock: FakeClock,
    producer: MemoryRecordProducer,
) -> None:
    a = make("a")
    did = _due(store, clock, "s-1")
    other = _due(store, clock, "s-2")
    store.park("order", "s-1")
    for _ in range(40):  # over 5 minutes of virtual time, each step within the lease
        a.step()
        clock.advance(8)
    assert _fired(producer) == [(other, 1)]
    store.park("order", "s-1", parked=False)  # an operator's retry
    a.step()
    assert _fired(producer) == [(other, 1), (did, 1)]


def test_a_restarted_holder_with_the_same_name_gets_a_new_larger_token(
    make: Callable[..., DeadlinePoller], store: MemoryDeadlineStore, clock: FakeClock
) -> None:
    old = make("pod-0")
    assert old.acquire() == 1
    clock.advance(4)
    assert old.acquire() == 1  # a renewal by the live holder keeps its token
    new = make("pod-0")  # the same name, restarted while the old process is frozen
    assert new.acquire() is None  # the old lease is still valid: wait for it
    clock.advance(TTL + 1)
    assert new.acquire() == 2
    # The frozen process wakes up: its renewal fails, and its claims are refused.
    assert old.acquire() is None
    assert store.claim_due("pod-0", 1, 10, full=True) == ([], None)
    clock.advance(4)
    assert new.acquire() == 2


def test_a_new_leader_fires_rows_its_predecessor_dispatched_at_once(
    make: Callable[..., DeadlinePoller],
    store: MemoryDeadlineStore,
    clock: FakeClock,
    producer: MemoryRecordProducer,
) -> None:
    a, b = make("a"), make("b")
    did = _due(store, clock)
    a.step()
    clock.advance(TTL + 1)  # well before the dispatch goes stale
    b.step()
    assert _fired(producer) == [(did, 1), (did, 2)]


def test_the_poller_sleeps_until_the_next_due_time_or_the_interval(
    make: Callable[..., DeadlinePoller],
    store: MemoryDeadlineStore,
    clock: FakeClock,
    producer: MemoryRecordProducer,
) -> None:
    a = make("a")
    assert a.step() == INTERVAL  # nothing pending
    did = store.add("order", "s-1", "timeout", clock.now() + timedelta(seconds=2))
    assert a.step() == pytest.approx(2.0)
    clock.advance(2)
    a.step()
    assert _fired(producer) == [(did, 1)]
    # Fired but not handled yet: the next wake-up is when it would go stale, capped by the interval.
    assert a.step() == INTERVAL
    store.delete(did)
    clock.advance(REDISPATCH)
    assert a.step() == INTERVAL
    assert len(producer.sent) == 1


def test_a_poller_without_the_lease_sleeps_one_interval(
    make: Callable[..., DeadlinePoller], store: MemoryDeadlineStore, clock: FakeClock
) -> None:
    make("a").acquire()
    store.add("order", "s-1", "timeout", clock.now() + timedelta(seconds=1))
    assert make("b").step() == INTERVAL


# -- the loop ------------------------------------------------------------------------------------


def test_run_goes_on_after_a_retryable_failure_and_drops_its_token(
    store: MemoryDeadlineStore, producer: MemoryRecordProducer, clock: FakeClock
) -> None:
    hooks, stop, steps = Hooks(), threading.Event(), []
    poller = DeadlinePoller(store, producer, holder="a", settings=SETTINGS, hooks=hooks)
    did = _due(store, clock)

    def at_step() -> None:
        steps.append(poller.token)
        if len(steps) == 1:
            poller.token = 7  # as if it held a lease before the failure
            raise Retryable("connection lost")
        stop.set()  # the step still runs; the sleep after it returns at once

    hooks.on("poller-step", at_step)
    poller.run(stop)
    assert steps == [None, None]
    assert _fired(producer) == [(did, 1)]


def test_run_stops_on_any_other_failure(
    store: MemoryDeadlineStore, producer: MemoryRecordProducer
) -> None:
    hooks = Hooks()
    poller = DeadlinePoller(store, producer, holder="a", settings=SETTINGS, hooks=hooks)

    def bug() -> None:
        raise ZeroDivisionError

    hooks.on("poller-step", bug)
    with pytest.raises(ZeroDivisionError):
        poller.run(threading.Event())


def test_run_goes_on_after_the_store_fails_and_is_woken_by_a_new_deadline(
    store: MemoryDeadlineStore, producer: MemoryRecordProducer, clock: FakeClock
) -> None:
    slow = SETTINGS.model_copy(
        update={"polling": DeadlinePollingSettings(interval=timedelta(minutes=5))}
    )
    poller = DeadlinePoller(store, producer, holder="a", settings=slow)
    store.fail_next(1)
    stop = threading.Event()
    thread = threading.Thread(target=poller.run, args=(stop,), daemon=True)
    thread.start()
    try:
        _eventually(lambda: poller.token is not None)
        did = _due(store, clock)
        _eventually(lambda: bool(producer.sent))
        assert _fired(producer) == [(did, 1)]
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()


def _eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_a_burst_is_claimed_in_growing_sweeps_then_the_size_returns(
    store: MemoryDeadlineStore,
    producer: MemoryRecordProducer,
    clock: FakeClock,
    make: Callable[..., DeadlinePoller],
) -> None:
    for i in range(1000):
        store.add("order", f"s-{i}", "timeout", clock.now() - HOUR)
    limits: list[int] = []
    claim = store.claim_due

    def counting(holder: str, token: int, limit: int, *, full: bool) -> object:
        limits.append(limit)
        return claim(holder, token, limit, full=full)

    store.claim_due = counting  # type: ignore[method-assign,assignment]
    poller = make("a")
    poller.step()

    assert len(producer.sent) == 1000
    # 10, 20, 40, ... : a burst of 1,000 costs 7 round trips instead of 100.
    assert limits == [10, 20, 40, 80, 160, 320, 640]
    store.add("order", "late", "timeout", clock.now() - HOUR)
    limits.clear()
    poller.step()
    assert limits == [10]
