"""The consumer adapter against a real broker: a member the group goes on without is replaced.

After a broker restart, a librdkafka client was seen to give up its partitions when its session
expired and never rejoin, its coordinator requests waiting in a connection that never came up.
That wedge cannot be provoked on demand, so these tests make a client drop out of its group the
way it looks to the broker: the client leaves its subscription behind the adapter's back.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping

import pytest

from processor._engine.records import Record
from processor._kafka.client import SagaConsumer
from tests.support.harness import Publisher, wait_until

pytestmark = pytest.mark.integration

TP = tuple[str, int]
# The broker's smallest session timeout (group.min.session.timeout.ms): the watch starts two
# session timeouts after a member last held a partition and needs two checks one apart.
SESSION_MS = 6000


class Member:
    def __init__(self, kafka: str, topic: str, group: str) -> None:
        self.assigned: list[list[TP]] = []
        self.records: list[Record] = []
        self.consumer = SagaConsumer(
            {"bootstrap.servers": kafka},
            group_id=group,
            topics=[topic],
            on_assign=self._assign,
            on_revoke=lambda tps: None,
            session_timeout_ms=SESSION_MS,
        )

    def _assign(self, tps: list[TP]) -> Mapping[TP, int | None]:
        if tps:
            self.assigned.append(tps)
        return dict.fromkeys(tps)

    def poll(self) -> None:
        self.records += self.consumer.consume(100, 0.2)


def until(members: list[Member], check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    def polled() -> bool:
        for m in members:
            m.poll()
        return check()

    wait_until(polled, timeout=timeout, what=what)


def test_a_member_the_group_went_on_without_is_replaced_and_idle_or_departed_ones_are_not(
    kafka_bootstrap: str, make_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    topic = make_topic("in", partitions=1)
    tp = (topic, 0)
    group = f"member-{uuid.uuid4().hex[:8]}"
    pub = Publisher(kafka_bootstrap)
    for i in range(4):
        pub.raw(topic, f"k{i}".encode(), f"v{i}".encode(), [])
    pub.flush()
    first = Member(kafka_bootstrap, topic, group)
    members = [first]
    try:
        until(members, lambda: len(first.records) == 4, "the first member's records")
        # More members than partitions: two stay in the group with nothing, one leaves.
        members += [Member(kafka_bootstrap, topic, group) for _ in range(3)]
        departed = members[3]
        departed.consumer.leave()

        # The first member's client leaves the group; the adapter still means to be in it.
        with caplog.at_level(logging.WARNING, logger="processor._kafka.client"):
            first.consumer._consumer.unsubscribe()
            until(members, lambda: not first.consumer.assigned, "the client's partition gone")
            until(
                members,
                lambda: first.consumer.rebalances["replaced"] == 1,
                "the member's client replaced",
            )
        [line] = [r.getMessage() for r in caplog.records if "replacing" in r.getMessage()]
        assert f"group {group}: this member has held no partition for" in line
        assert "the group (stable, 2 member(s)) has gone on without it" in line
        # At least two checks saw the group settled without it (the first starts the count).
        assert first.consumer.membership_checks >= 2

        holder = next(m for m in members[1:3] if m.consumer.assigned == {tp})
        [idle] = [m for m in members[1:3] if m is not holder]
        # The idle member is asked about, and the group lists it; the departed one is not.
        until(members, lambda: idle.consumer.membership_checks >= 2, "two checks of the idle")
        assert [m.consumer.rebalances["replaced"] for m in members[1:]] == [0, 0, 0]
        assert departed.consumer.membership_checks == 0
        assert holder.consumer.membership_checks == 0

        # The new client is a member like any other: it is given the partition and reads it.
        first.records.clear()
        holder.consumer.leave()
        idle.consumer.leave()
        until(members, lambda: len(first.records) == 4, "the records read by the new client")
        assert first.consumer.assigned == {tp}
    finally:
        for m in members:
            m.consumer.close()
