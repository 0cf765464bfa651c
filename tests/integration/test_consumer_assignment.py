"""The Kafka consumer adapter against a real broker: what a fresh assignment starts from.

The worker pauses partitions it cannot claim yet and relies on every assignment starting
unpaused (as the in-memory consumer does). librdkafka remembers a pause through a revocation,
so the adapter must clear it, or a partition paused once and assigned back later is never read.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor._engine.records import Record
from processor._kafka.client import SagaConsumer
from tests.support.harness import Publisher, wait_until

pytestmark = pytest.mark.integration

TP = tuple[str, int]


class Member:
    """A SagaConsumer that starts each assigned partition where `starts` says."""

    def __init__(self, kafka: str, topic: str) -> None:
        self.assigned: list[list[TP]] = []
        self.revoked: list[list[TP]] = []
        self.records: list[Record] = []
        self.consumer = SagaConsumer(
            {"bootstrap.servers": kafka},
            group_id=f"assign-{uuid.uuid4().hex[:8]}",
            topics=[topic],
            on_assign=self._assign,
            on_revoke=self.revoked.append,
            session_timeout_ms=6000,
        )

    def _assign(self, tps: list[TP]) -> Mapping[TP, int | None]:
        self.assigned.append(tps)
        return dict.fromkeys(tps, 1)  # skip the first record: the start offset must hold

    def poll(self) -> None:
        self.records += self.consumer.consume(100, 0.2)

    def until(self, check: Callable[[], bool], what: str) -> None:
        def polled() -> bool:
            self.poll()
            return check()

        wait_until(polled, timeout=60, what=what)


@pytest.fixture
def member(kafka_bootstrap: str, make_topic: Callable[..., str]) -> Iterator[Member]:
    topic = make_topic("in")
    pub = Publisher(kafka_bootstrap)
    for i in range(3):
        pub.raw(topic, b"k", f"v{i}".encode(), [])
    pub.flush()
    m = Member(kafka_bootstrap, topic)
    try:
        yield m
    finally:
        m.consumer.close()  # a second close is a no-op


def test_a_partition_paused_before_its_revocation_is_read_when_assigned_again(
    member: Member,
) -> None:
    member.until(lambda: len(member.assigned) == 1, "the first assignment")
    tp = member.assigned[0][0]
    member.consumer.pause([tp])
    member.records.clear()  # whatever was fetched before the pause does not count

    member.consumer.leave()
    member.until(lambda: len(member.revoked) == 1, "the revocation")
    member.consumer.rejoin()
    member.until(lambda: len(member.assigned) == 2, "the second assignment")

    member.until(lambda: len(member.records) >= 2, "the records of the partition")
    assert [r.value for r in member.records] == [b"v1", b"v2"]
    assert [r.offset for r in member.records] == [1, 2]


def test_the_lag_gauge_sees_the_log_end_of_a_partition_that_is_not_fetched(
    member: Member, kafka_bootstrap: str
) -> None:
    member.until(lambda: len(member.assigned) == 1, "the first assignment")
    tp = member.assigned[0][0]
    member.until(lambda: len(member.records) == 2, "the records before the pause")
    member.consumer.pause([tp])
    pub = Publisher(kafka_bootstrap)
    for i in range(3, 8):
        pub.raw(tp[0], b"k", f"v{i}".encode(), [])
    pub.flush()
    for _ in range(5):
        member.poll()  # the paused partition is not fetched: the client's cache stays at 3

    # Asked of the broker, not of the consuming client's cache; partitions not assigned here
    # are left out.
    assert member.consumer.high_watermarks([tp, (tp[0], 99)]) == {tp: 8}
    member.consumer.close()
    assert member.consumer.high_watermarks([tp]) == {}


class RefusingSeeks:
    """The real client, but its next ``refusals`` seeks fail as librdkafka's do for a
    partition whose fetch is not running (`_STATE`)."""

    def __init__(self, client: Any, refusals: int) -> None:
        self._client = client
        self.refusals = refusals
        self.seeks = 0

    def seek(self, partition: TopicPartition) -> None:
        self.seeks += 1
        if self.refusals:
            self.refusals -= 1
            raise KafkaException(KafkaError(KafkaError._STATE, "fetch not started"))
        self._client.seek(partition)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@pytest.mark.parametrize("refusals", [1, 3])
def test_a_refused_seek_is_tried_again_and_no_record_after_it_is_delivered_meanwhile(
    member: Member, kafka_bootstrap: str, refusals: int
) -> None:
    # The worker commits a batch as following the position it sought: records delivered from
    # where the fetch stood instead would be committed past the ones in between, unread.
    member.until(lambda: len(member.records) == 2, "the records from the start offset")
    tp = (member.records[0].topic, member.records[0].partition)
    pub = Publisher(kafka_bootstrap)
    for i in range(3, 8):
        pub.raw(tp[0], b"k", f"v{i}".encode(), [])
    pub.flush()
    member.consumer.pause([tp])
    client = RefusingSeeks(member.consumer._consumer, refusals)
    member.consumer._client.made = client  # type: ignore[assignment]
    member.records.clear()

    member.consumer.seek(tp, 1)
    member.consumer.resume([tp])
    member.until(lambda: len(member.records) >= 7, "the records from the sought position")

    assert client.seeks == refusals + 1
    assert [r.offset for r in member.records] == list(range(1, 8))


def test_an_end_read_before_a_revocation_is_not_reported_for_the_next_assignment(
    member: Member,
) -> None:
    # A replica that gives its partitions back keeps polling, and reads on to their ends. An
    # end kept from then and reported after the partition is assigned again would be stored as
    # read (the worker's advance_ends) before the records from the claimed position are:
    # those records would be skipped.
    member.until(lambda: len(member.assigned) == 1, "the first assignment")
    tp = member.assigned[0][0]
    member.until(lambda: tp in member.consumer._ends, "the end of the partition")

    member.consumer.leave()
    member.until(lambda: len(member.revoked) == 1, "the revocation")
    member.records.clear()
    member.consumer.rejoin()

    def assigned_again() -> bool:
        # Without waiting: the poll that runs the assignment returns before any fetch of it.
        member.records += member.consumer.consume(100, 0)
        return len(member.assigned) == 2

    wait_until(assigned_again, timeout=60, what="the second assignment")
    reported = member.consumer.ends()
    read = [r.offset for r in member.records]
    # Any end reported now must come after every record from the start offset (1) to it.
    assert all(read == list(range(1, end)) for end in reported.values()), (reported, read)


def test_a_read_returns_the_records_that_came_without_waiting_for_a_full_batch(
    member: Member, kafka_bootstrap: str
) -> None:
    # A read waits for the first record only: what came with it is the batch. One that waited
    # for a full batch (or its timeout) would hold a light load's every record back by the
    # timeout at each hop of a saga.
    member.until(lambda: len(member.records) == 2, "the records already there")
    [tp] = member.assigned[0]
    got: list[Record] = []

    def read() -> None:
        # Far more room than records, and a timeout far past the wait below.
        got.extend(member.consumer.consume(500, 300.0))

    reader = threading.Thread(target=read, name="read", daemon=True)
    reader.start()
    pub = Publisher(kafka_bootstrap)
    pub.raw(tp[0], b"k", b"v3", [])
    pub.flush()
    wait_until(lambda: not reader.is_alive(), timeout=60, what="the read to return its record")
    assert [r.value for r in got] == [b"v3"]
