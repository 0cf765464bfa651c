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

from processor.engine.records import Record
from processor.kafka.client import SagaConsumer
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


def test_a_member_whose_client_dropped_out_of_its_group_is_replaced_and_reads_again(
    kafka_bootstrap: str, make_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    topic = make_topic("in", partitions=2)
    group = f"member-{uuid.uuid4().hex[:8]}"
    pub = Publisher(kafka_bootstrap)
    for i in range(4):
        pub.raw(topic, f"k{i}".encode(), f"v{i}".encode(), [])
    pub.flush()
    m = Member(kafka_bootstrap, topic, group)
    try:
        until([m], lambda: len(m.records) == 4, "the first member's records")
        assert m.consumer.assigned == {(topic, 0), (topic, 1)}

        # The client leaves the group; the adapter still means to be in it.
        m.consumer._consumer.unsubscribe()
        until([m], lambda: not m.consumer.assigned, "the client's partitions gone")
        m.records.clear()

        with caplog.at_level(logging.WARNING, logger="processor.kafka.client"):
            until(
                [m],
                lambda: m.consumer.assigned == {(topic, 0), (topic, 1)},
                "the partitions assigned to a new client",
            )
        assert m.consumer.rebalances["replaced"] == 1
        # At least two checks saw the group settled without it (the first starts the count).
        assert m.consumer.membership_checks >= 2
        [line] = [r.getMessage() for r in caplog.records if "replacing" in r.getMessage()]
        assert f"group {group}: this member has held no partition for" in line
        assert "the group (empty, 0 member(s)) has gone on without it" in line
        # The new client starts where the worker says: from the beginning here.
        until([m], lambda: len(m.records) == 4, "every record read again by the new client")
    finally:
        m.consumer.close()


def test_an_idle_member_the_group_lists_and_one_that_left_are_not_replaced(
    kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    topic = make_topic("in", partitions=1)
    group = f"member-{uuid.uuid4().hex[:8]}"
    members = [Member(kafka_bootstrap, topic, group) for _ in range(3)]
    try:
        until(members, lambda: sum(len(m.assigned) for m in members) == 1, "one assignment")
        holder = next(m for m in members if m.assigned)
        idle, gone = (m for m in members if m is not holder)
        gone.consumer.leave()
        # More members than partitions: the idle one is asked about, and the group lists it.
        until(members, lambda: idle.consumer.membership_checks >= 3, "three checks of it")
        assert [m.consumer.rebalances["replaced"] for m in members] == [0, 0, 0]
        assert gone.consumer.membership_checks == 0  # it left: nothing to watch
        assert holder.consumer.membership_checks == 0
        assert holder.consumer.assigned == {(topic, 0)}
    finally:
        for m in members:
            m.consumer.close()
