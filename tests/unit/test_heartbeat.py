"""A loop that hangs (its thread alive, its work stopped) is reported dead, like one that died."""

from __future__ import annotations

import logging
import threading

import pytest

from processor._runtime.heartbeat import beat
from processor._runtime.supervisor import Supervisor


def _idle(stop: threading.Event) -> None:
    stop.wait(10)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_loop_that_stops_beating_is_reported_hung_once_and_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = threading.Event()
    clock = Clock()
    supervisor = Supervisor(stop, clock=clock)
    beaten, release = threading.Event(), threading.Event()
    resumed = threading.Event()

    def loop(stop: threading.Event) -> None:
        import processor._runtime.heartbeat as hb

        hb._beats[threading.get_ident()] = clock.now  # beat() on the fake clock
        beaten.set()
        release.wait(10)  # a call that does not return
        hb._beats[threading.get_ident()] = clock.now
        resumed.set()
        stop.wait(10)

    supervisor.spawn("relay", loop, hang_after=30.0)
    supervisor.spawn("plain", _idle)  # no heartbeat: never hung
    assert beaten.wait(5)
    clock.now += 29
    assert supervisor.alive() == {"relay": True, "plain": True}
    clock.now += 2
    with caplog.at_level(logging.ERROR, logger="processor._runtime.supervisor"):
        assert supervisor.alive() == {"relay": False, "plain": True}
        assert supervisor.alive()["relay"] is False
    assert [r.getMessage() for r in caplog.records] == [
        "loop 'relay' has made no progress for 31 s (bound 30 s): it is hung; health reports "
        "it dead so that the process is restarted"
    ]
    release.set()
    assert resumed.wait(5)
    assert supervisor.alive()["relay"] is True
    stop.set()
    assert supervisor.join(lambda: 5.0) == []


def test_a_loop_that_never_beats_is_measured_from_its_start() -> None:
    stop = threading.Event()
    clock = Clock()
    supervisor = Supervisor(stop, clock=clock)
    supervisor.spawn("poller", _idle, hang_after=5.0)
    clock.now += 6
    assert supervisor.alive() == {"poller": False}
    stop.set()
    assert supervisor.join(lambda: 5.0) == []


def test_beat_records_the_calling_thread() -> None:
    from processor._runtime.heartbeat import last_beat

    beat()
    assert last_beat(threading.current_thread()) is not None
