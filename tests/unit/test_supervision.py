"""The supervisor and Processor.run: a dead loop stops every loop and surfaces as LoopDied."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest

from processor._bootstrap.processor import build_processor
from processor._errors import Failure, LoopDied, classify
from processor._runtime.processor import Processor
from processor._runtime.supervisor import Supervisor
from processor.settings import ProcessorSettings
from sagas import EXAMPLE_SAGAS


def _until_stopped(stop: threading.Event) -> None:
    stop.wait(30)


def test_a_raising_loop_is_recorded_logged_and_stops_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = threading.Event()
    sup = Supervisor(stop)
    other = sup.spawn("relay-listener", _until_stopped)

    def broken(_stop: threading.Event) -> None:
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR):
        sup.spawn("relay", broken)
        assert sup.failed.wait(5)
    assert stop.is_set()
    other.join(5)
    assert not other.is_alive()
    failure = sup.failure
    assert failure is not None
    assert failure.loop == "relay"
    assert isinstance(failure.error, RuntimeError)
    assert failure.describe() == "loop 'relay' died: RuntimeError: boom"
    [rec] = [r for r in caplog.records if "relay" in r.getMessage()]
    assert rec.levelno == logging.ERROR
    assert rec.exc_info is not None
    assert sup.alive() == {"relay-listener": False, "relay": False}


def test_a_loop_that_returns_while_running_counts_as_dead() -> None:
    stop = threading.Event()
    sup = Supervisor(stop)
    sup.spawn("deadline-poller", lambda _stop: None)
    assert sup.failed.wait(5)
    failure = sup.failure
    assert failure is not None
    assert failure.error is None
    assert "ended while the processor was running" in failure.describe()


def test_loops_that_stop_when_asked_are_not_failures() -> None:
    stop = threading.Event()
    sup = Supervisor(stop)
    sup.spawn("relay", _until_stopped)
    assert sup.alive() == {"relay": True}
    stop.set()
    assert sup.join(lambda: 5.0) == []
    assert sup.failure is None
    assert not sup.failed.is_set()


class _FakeWorker:
    """Stands in for the worker: counts polls, raises when told, closes cleanly."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.polls = 0
        self.fail_at = fail_at
        self.closed = False
        self.consumer = None
        self.store = self.control = self

    def poll_once(self) -> int:
        self.polls += 1
        if self.fail_at is not None and self.polls >= self.fail_at:
            raise ValueError("consumer bug")
        time.sleep(0.01)  # a consume() call's wait, not synchronisation
        return 0

    def close(self) -> None:
        self.closed = True


def _processor(worker: _FakeWorker) -> Processor:
    settings = ProcessorSettings(
        shutdown_timeout=timedelta(seconds=5),
        database={"url": "postgresql://saga@127.0.0.1/saga"},
        sagas=["sagas.transfer:TransferSaga"],
    )
    proc = build_processor(settings, list(EXAMPLE_SAGAS))
    proc.worker = worker  # type: ignore[assignment]
    # No database here: the fake worker is the whole of what runs, so nothing is started
    # (nor the growth watch, whose first round the first poll would wait for).
    proc._started = True
    proc.loops.growth.first_round.set()
    return proc


class _StoppingWorker(_FakeWorker):
    """Stops its processor at its first poll."""

    proc: Processor

    def poll_once(self) -> int:
        self.proc.stop()
        return super().poll_once()


def test_the_first_poll_waits_for_the_growth_watch_s_first_round() -> None:
    # Until that round every partition is held: one assigned before it is paused, then
    # resumed, and librdkafka fetches it again only up to a second later.
    worker = _StoppingWorker()
    proc = worker.proc = _processor(worker)
    polls_while_waiting: list[int] = []

    class FirstRound(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            polls_while_waiting.append(worker.polls)
            self.set()  # the round ends while the consumer waits
            return True

    proc.loops.growth.first_round = FirstRound()
    proc.run()
    assert polls_while_waiting == [0]
    assert worker.polls == 1


def test_the_first_poll_waits_for_the_growth_watch_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("processor._runtime.processor.FIRST_GROWTH_WAIT", 0.05)
    worker = _StoppingWorker()
    proc = worker.proc = _processor(worker)
    proc.loops.growth.first_round = threading.Event()  # a store away: the round never ends
    with caplog.at_level(logging.INFO, logger="processor._runtime.processor"):
        proc.run()
    assert worker.polls == 1
    assert "has not read the partition counts yet; polling" in caplog.text


def test_run_notices_a_dead_background_loop_and_raises_loop_died() -> None:
    worker = _FakeWorker()
    proc = _processor(worker)
    release = threading.Event()

    def relay(_stop: threading.Event) -> None:
        release.wait(5)
        raise RuntimeError("relay bug")

    proc._spawn("relay", relay)
    outcome: list[BaseException] = []
    health: list[dict[str, bool]] = []

    def main() -> None:
        try:
            proc.run()
        except BaseException as e:
            outcome.append(e)

    runner = threading.Thread(target=main)
    runner.start()
    deadline = time.monotonic() + 5
    while worker.polls == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    health.append(proc.health())
    started = time.monotonic()
    release.set()
    runner.join(5)
    assert not runner.is_alive()
    assert time.monotonic() - started < 2
    assert health[0] == {"consumer": True, "relay": True}
    [error] = outcome
    assert isinstance(error, LoopDied)
    assert classify(error) is Failure.FATAL
    assert "loop 'relay' died: RuntimeError: relay bug" in str(error)
    assert isinstance(error.__cause__, RuntimeError)
    assert worker.closed
    assert proc.health() == {"consumer": False, "relay": False}


def test_run_turns_a_consumer_loop_error_into_loop_died_after_stopping_the_others() -> None:
    worker = _FakeWorker(fail_at=3)
    proc = _processor(worker)
    seen_stop: list[bool] = []

    def poller(stop: threading.Event) -> None:
        seen_stop.append(stop.wait(5))

    proc._spawn("deadline-poller", poller)
    with pytest.raises(LoopDied, match="loop 'consumer' died: ValueError"):
        proc.run()
    assert seen_stop == [True]
    assert worker.closed


def test_run_after_stop_raises_nothing() -> None:
    worker = _FakeWorker()
    proc = _processor(worker)
    proc._spawn("relay", _until_stopped)
    threading.Timer(0.1, proc.stop).start()
    proc.run()
    assert proc.failure is None


def test_building_a_processor_binds_no_port_and_connects_nothing() -> None:
    # The loops are built whole before start(): a socket bound then would make start()'s check
    # that the metrics port is free fail on the processor's own endpoint.
    import socket

    from processor._observe.server import check_port_free

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = ProcessorSettings(
        database={"url": "postgresql://saga@127.0.0.1:1/saga"},
        kafka={"bootstrap_servers": "127.0.0.1:1"},
        metrics={"port": port},
        sagas=["sagas.transfer:TransferSaga"],
    )
    # Only threads this build started: a processor another test of this worker ran may still
    # be ending its own (a metrics sampler between two samples), which says nothing of this one.
    before = set(threading.enumerate())
    proc = build_processor(settings, list(EXAMPLE_SAGAS))
    check_port_free("127.0.0.1", port)
    threads = {t.name for t in set(threading.enumerate()) - before}
    assert not any(n.startswith(("lane", "batch", "control", "metrics")) for n in threads), threads
    assert proc.observe.server is None
