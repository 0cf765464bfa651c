"""The retention loop over a scripted store: chunks, periods, a busy lock, failures, stopping."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from processor._errors import RecordDataError, Retryable
from processor._ports import Purge
from processor._runtime.retention import Retention, periods
from processor.settings import RetentionSettings


class Store:
    """Holds a number of due rows per kind and deletes them in chunks, recording each call."""

    def __init__(self, due: dict[Purge, int] | None = None) -> None:
        self.due = dict(due or {})
        self.calls: list[tuple[Purge, timedelta, int]] = []
        self.busy_after: int | None = None  # calls after which another replica holds the lock
        self.fail: Exception | None = None
        self.closed = False
        self.failures = 0

    def purge(self, what: Purge, older_than: timedelta, limit: int) -> int | None:
        if self.fail is not None:
            self.failures += 1
            raise self.fail
        if self.busy_after is not None and len(self.calls) >= self.busy_after:
            return None
        self.calls.append((what, older_than, limit))
        n = min(limit, self.due.get(what, 0))
        self.due[what] = self.due.get(what, 0) - n
        return n

    def close(self) -> None:
        self.closed = True


def _settings(**kw: object) -> RetentionSettings:
    base: dict[str, object] = {"chunk_size": 10, "chunk_pause": "0s", "interval": "10ms"}
    return RetentionSettings.model_validate({**base, **kw})


def test_a_round_deletes_each_kind_in_chunks_until_a_short_chunk() -> None:
    store = Store({Purge.ENDED_HISTORY: 15, Purge.ENDED_SAGAS: 25, Purge.DEAD_LETTERS: 10})
    retention = Retention(store, _settings(dead_letters="30d", failed_outbox="30d"))

    done = retention.round()

    assert done is not None
    assert done[Purge.ENDED_HISTORY] == 15
    assert done[Purge.ENDED_SAGAS] == 25
    assert done[Purge.DEAD_LETTERS] == 10
    kinds = [c[0] for c in store.calls]
    # 10 + 10 + 5 for ended sagas, each full chunk sending the round back to their history
    # first; a full chunk of dead letters asks once more and finds none.
    assert kinds.count(Purge.ENDED_SAGAS) == 3
    assert kinds.count(Purge.DEAD_LETTERS) == 2
    assert kinds[:7] == [
        Purge.ENDED_HISTORY,
        Purge.ENDED_HISTORY,
        Purge.ENDED_SAGAS,
        Purge.ENDED_HISTORY,
        Purge.ENDED_SAGAS,
        Purge.ENDED_HISTORY,
        Purge.ENDED_SAGAS,
    ]
    assert [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k][-6:] == list(Purge)[2:]
    assert {c[2] for c in store.calls} == {10}
    assert retention.rounds == 1
    assert retention.deleted == done


def test_unhandled_dead_letters_and_failed_commands_are_kept_by_default() -> None:
    store = Store({Purge.DEAD_LETTERS: 5, Purge.FAILED_OUTBOX: 5})
    assert RetentionSettings().dead_letters is None
    assert RetentionSettings().failed_outbox is None
    Retention(store, _settings()).round()
    kinds = {c[0] for c in store.calls}
    assert Purge.DEAD_LETTERS not in kinds
    assert Purge.FAILED_OUTBOX not in kinds
    assert (store.due[Purge.DEAD_LETTERS], store.due[Purge.FAILED_OUTBOX]) == (5, 5)


def test_each_kind_is_measured_by_its_own_period() -> None:
    settings = _settings(
        ended_sagas="1d",
        history="2d",
        dedupe_window="9d",
        dead_letters="3d",
        parked_messages="4d",
        failed_outbox="5d",
    )
    store = Store()
    Retention(store, settings).round()
    days = {what: age.days for what, age, _ in store.calls}
    assert days == {
        Purge.ENDED_HISTORY: 1,
        Purge.ENDED_SAGAS: 1,
        Purge.HISTORY: 2,
        Purge.APPLIED: 9,
        Purge.TOMBSTONES: 9,
        Purge.DEAD_LETTERS: 3,
        Purge.PARKED: 4,
        Purge.FAILED_OUTBOX: 5,
    }
    assert [w for w, _ in periods(settings)] == list(Purge)


def test_a_round_ends_when_another_replica_holds_the_lock() -> None:
    store = Store({Purge.ENDED_SAGAS: 100})
    store.busy_after = 2
    retention = Retention(store, _settings())

    assert retention.round() is None
    # The history, then a full chunk of sagas, the history again, and then the lock was taken.
    assert retention.deleted[Purge.ENDED_SAGAS] == 10
    assert retention.rounds == 0
    assert len(store.calls) == 2


def test_the_dedupe_window_must_cover_the_purges() -> None:
    with pytest.raises(ValueError, match="dedupe-window"):
        RetentionSettings(ended_sagas=timedelta(days=10), dedupe_window=timedelta(days=5))
    with pytest.raises(ValueError, match="dedupe-window"):
        RetentionSettings(history=timedelta(days=100))


def _wait_for(condition: object, what: str, timeout: float = 5.0) -> None:
    ends = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > ends:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_run_survives_an_unreachable_store_and_stops_promptly() -> None:
    store = Store({Purge.HISTORY: 5})
    store.fail = Retryable("database unavailable")
    retention = Retention(store, _settings())
    stop = threading.Event()
    thread = threading.Thread(target=retention.run, args=(stop,))
    thread.start()
    try:
        _wait_for(lambda: store.failures >= 2, "two failed rounds")
        assert retention.rounds == 0
        store.fail = None
        _wait_for(lambda: retention.deleted[Purge.HISTORY] == 5, "a round after the outage")
    finally:
        stop.set()
        thread.join(2.0)
    assert not thread.is_alive()
    assert store.closed


def test_run_ends_on_a_failure_that_is_not_transient() -> None:
    store = Store()
    store.fail = RecordDataError("22000", "refused")
    retention = Retention(store, _settings())
    with pytest.raises(RecordDataError):
        retention.run(threading.Event())


def test_a_long_interval_does_not_delay_a_stop_or_a_wake() -> None:
    store = Store()
    retention = Retention(store, _settings(interval="1h"))
    stop = threading.Event()
    thread = threading.Thread(target=retention.run, args=(stop,))
    thread.start()
    try:
        retention.wake.set()
        _wait_for(lambda: retention.rounds == 1, "a round on wake")
        started = time.monotonic()
        stop.set()
        thread.join(2.0)
        assert not thread.is_alive()
        assert time.monotonic() - started < 1.0
    finally:
        stop.set()
        thread.join(2.0)
