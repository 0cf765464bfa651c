"""SIGTERM ends a processor and a participant service in time, even with the broker gone.

The order saga runs in a processor process and its participants in a participant service
process, on a private stack whose broker every client reaches through a TCP proxy. Twice, while
orders flow, the broker goes away and both processes get SIGTERM:

- black-holed: the proxy holds every byte and nothing errors or answers;
- killed with SIGKILL: no controlled shutdown, connections refused.

Each time one of the two also meets the worst a client library can do: its consumer's
revocation callback (which runs inside the close) blocks for ever holding the interpreter lock,
so no Python thread runs again (``tests.support.stuck``). Both processes still exit within their
shutdown budget plus the native watchdog's margin (:mod:`processor._runtime.stopping`): the
stuck one with exit code 1 after a dump of every thread, the other with 0 (3 if its budget ran
out, 1 if librdkafka's close held the interpreter by itself). Then the broker comes back, new
processes take over, and every saga ends with each command applied once, answered once, and the
books balanced: leaving early lost nothing and applied nothing twice.
"""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

import pytest

from devstack import wait_for_kafka
from processor._bootstrap.participant import SHUTDOWN_TIMEOUT as PARTICIPANT_BUDGET
from processor._runtime.stopping import EXIT_OVERRAN, EXIT_STUCK, MARGIN
from tests.support.harness import wait_until
from tests.support.order_world import OrderWorld, assert_books, order_world
from tests.support.private_stack import PrivateStack

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

log = logging.getLogger(__name__)

ORDERS = 30
BUDGET = 5.0
# Python's start, the last log lines and the kernel's reaping, on a loaded 2-core machine.
SLACK = 5.0
# The consumer's revocation callback blocks for ever with the GIL held (inside its close).
STUCK_CLOSE = {"SAGA_FAULT_POINT": "revoke", "SAGA_FAULT_ACTION": "hold-gil"}


def _terminate(world: OrderWorld, stuck: str) -> None:
    """SIGTERMs the running processor and participant service at once; checks how they end.

    ``stuck`` names the one whose close holds the interpreter for ever.
    """
    budget = world.settings.shutdown_timeout.total_seconds()
    processes = {
        "processor": (world.processors[-1].popen, world.processors[-1].log_path, budget),
        "participants": (
            world.participants[-1].popen,
            world.participants[-1].log_path,
            world.participant_budget or PARTICIPANT_BUDGET.total_seconds(),
        ),
    }
    for name, (popen, _, _) in processes.items():
        assert popen.poll() is None, f"{name} ended before it was asked to"
    started = time.monotonic()
    for popen, _, _ in processes.values():
        popen.terminate()
    ended: dict[str, tuple[int, float]] = {}
    for name, (popen, _, own) in processes.items():
        bound = own + MARGIN + SLACK
        try:
            code = popen.wait(max(0.0, started + bound - time.monotonic()))
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(10)
            pytest.fail(f"{name} still running {bound:.0f} s after SIGTERM")
        ended[name] = (code, time.monotonic() - started)
        log.info("%s exited %d after %.1f s (budget %.0f s)", name, code, ended[name][1], own)
    world.stop()  # closes the stopped processes' log files
    for name, (code, _) in ended.items():
        text = processes[name][1].read_text(errors="replace")
        if name == stuck:
            assert "fault: holding the interpreter lock for ever" in text
            # faulthandler's dump, with the frame that holds the lock.
            assert code == EXIT_STUCK, (name, code)
            assert "Timeout (" in text
            assert "in hold_the_interpreter" in text
        else:
            # Left to itself: a clean stop, an overrun, or librdkafka's own close holding the
            # interpreter (the hang this bound exists for) ended by the watchdog.
            assert code in (0, EXIT_OVERRAN, EXIT_STUCK), (name, code)


def _flowing(world: OrderWorld, ended: int, wave: str = "") -> None:
    """Waits until ``ended`` sagas ended, of the orders of ``wave`` (any, by default)."""
    wait_until(
        lambda: sum(order.startswith(wave) for order in world.ended()) >= ended,
        timeout=120,
        what=f"{ended} sagas {wave} ended",
    )


def test_sigterm_exits_within_the_bound_with_the_broker_black_holed_or_killed(
    order_stack: PrivateStack, tmp_path: Path
) -> None:
    stack = order_stack
    proxy = stack.kafka_proxy
    assert proxy is not None
    # Short budgets: what is under test is that the bound holds, whatever its length.
    world = order_world(stack, tmp_path, shutdown_timeout=BUDGET)
    try:
        # 1. Black hole: every socket stays open, nothing moves; the processor's close sticks.
        world.start_participants()
        world.start_processor(fault=STUCK_CLOSE)
        world.place("w1", ORDERS)
        _flowing(world, 3)
        proxy.black_hole()
        _terminate(world, stuck="processor")
        proxy.heal()
        # Round 2's participant service: its close will stick (nothing revokes before it).
        world.start_participants(fault=STUCK_CLOSE)
        world.start_processor()
        # New processes take over what the stopped ones left, and more orders come. SIGTERM
        # must reach processes that run (a process still importing dies of it before it can
        # handle it), the participant service's consumer included: only w2's sagas count, as
        # each ends only once this round's service has answered its commands. Round 1's may end
        # on replies the stopped service left in the topic, with the new one still starting
        # (its shutdown then overran the budget before reaching the close that sticks).
        world.place("w2", ORDERS)
        _flowing(world, 6, wave="w2")

        # 2. The broker killed with SIGKILL; the participant service's close sticks.
        stack.kill_kafka()
        _terminate(world, stuck="participants")
        stack.up("kafka")
        wait_for_kafka(stack.kafka, timeout=120)
        world.start_participants()
        world.start_processor()
        world.wait_all_ended(timeout=240)
    finally:
        proxy.heal()
        world.stop()
    assert_books(world)
