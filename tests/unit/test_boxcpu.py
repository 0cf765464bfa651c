"""The /proc readings behind S1's whole-box CPU: a child's work counts while it runs and after."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from benchmarks import boxcpu

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")

# Busy for a fixed amount of work (not of time), then says so and waits for its stdin to close.
_BUSY = (
    "sum(i * i for i in range(3_000_000)); print('busy', flush=True); import sys; sys.stdin.read()"
)


def test_a_busy_child_counts_while_alive_and_once_reaped() -> None:
    me = os.getpid()
    before = boxcpu.tree_seconds(me)
    with subprocess.Popen(
        [sys.executable, "-c", _BUSY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        assert child.stdin is not None
        assert child.stdout.readline().strip() == "busy"
        assert child.pid in boxcpu.children_of(me)
        alive = boxcpu.process_seconds(child.pid)
        during = boxcpu.tree_seconds(me)
        child.stdin.close()
        child.wait()
    after = boxcpu.tree_seconds(me)
    assert before is not None
    assert during is not None
    assert after is not None
    assert alive is not None
    assert alive > 0
    # Live: the child's own time is in the tree's. Reaped: it moved into cutime/cstime.
    # (Clock ticks divided into seconds: equal sums may differ in the last float digit.)
    assert during - before >= alive - 1e-9
    assert after - before >= alive / 2


def test_the_listener_of_a_port_is_found() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert boxcpu.listener_pid(port) == os.getpid()
        assert boxcpu.broker_pid(f"127.0.0.1:{port},elsewhere:9092") == os.getpid()


def test_usage_per_event_leaves_out_what_was_not_read() -> None:
    used = boxcpu.Usage(processor=0.5, postgres=None, kafka=0.25).minus(
        boxcpu.Usage(processor=0.25, postgres=0.1, kafka=0.0)
    )
    per = used.per_event(1000)
    assert per["processor_us"] == pytest.approx(250.0)
    assert per["postgres_us"] is None
    assert per["box_us"] == pytest.approx(500.0)


def test_the_peak_resident_set_resets_to_the_current_one() -> None:
    now = boxcpu.reset_peak_rss()
    assert 0 < now <= boxcpu.peak_rss_mb()
    grown = bytearray(64 * 1024 * 1024)
    grown[::4096] = b"\1" * len(grown[::4096])
    assert boxcpu.peak_rss_mb() >= now + 32
    del grown
