"""Participants under fire: kill -9 at random points, PostgreSQL and the broker restarted.

The order saga runs in a processor process; the inventory, payment, fraud review and shipping
services run on the participant kit in another process, which is killed with SIGKILL at random
moments while orders flow and started again; then PostgreSQL restarts, then the broker. Only a
private PostgreSQL cluster and broker are restarted (see ``tests.support.private_stack``).

Afterwards every saga has ended and:
- every command was executed exactly once in effect: one inbox row per command message id, at
  most one payment and one reservation per order, and each order's net effect matches how its
  saga ended;
- every command got its reply, and a command answered more than once (redelivered after a
  crash) was answered with the very same reply (same message id);
- money and stock are conserved, end to end.
"""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

import pytest

from devstack import wait_for_kafka
from tests.support.harness import wait_until
from tests.support.order_world import OrderWorld, assert_books, order_world
from tests.support.private_stack import PrivateStack

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

ORDERS_PER_WAVE = 30


class Chaos:
    """The participant process, restarted after every kill, and the processor, kept running."""

    def __init__(self, world: OrderWorld) -> None:
        self.world = world
        self.kills = 0
        world.start_participants()
        world.start_processor()

    def kill_participants(self) -> None:
        self.world.participants[-1].kill()
        self.kills += 1
        self.world.start_participants()

    def keep_processor(self) -> None:
        # A processor that exits (e.g. its database was gone too long) is started again, as a
        # platform would.
        if not self.world.processors[-1].alive():
            self.world.start_processor()


def test_every_command_once_every_reply_money_conserved(
    order_stack: PrivateStack, tmp_path: Path
) -> None:
    stack = order_stack
    rng = random.Random(15)
    world = order_world(stack, tmp_path, saga="crash_saga", svc="crash_svc")
    chaos = Chaos(world)

    def progressed(n: int) -> bool:
        chaos.keep_processor()
        return len(world.ended()) >= n

    try:
        world.place("w1", ORDERS_PER_WAVE)
        # kill -9 at random points (random amounts of progress) while the first wave flows.
        for threshold in sorted(rng.sample(range(1, ORDERS_PER_WAVE - 4), 4)):
            wait_until(partial(progressed, threshold), timeout=120, what=f"{threshold} ended")
            chaos.kill_participants()
        world.place("w2", ORDERS_PER_WAVE)
        # PostgreSQL goes away under load and comes back.
        stack.down("postgres")
        stack.up("postgres")
        world.place("w3", ORDERS_PER_WAVE)
        # Then the broker.
        stack.down("kafka")
        stack.up("kafka")
        wait_for_kafka(stack.kafka, timeout=120)
        chaos.kill_participants()
        wait_until(
            lambda: progressed(len(world.placed)), timeout=400, what="every order saga to end"
        )
        wait_until(world.drained, timeout=120, what="the outboxes to drain")
    finally:
        world.stop()
    assert_books(world)
    assert chaos.kills >= 5
