"""One set of cases for the record producer and the group member consuming what it sent: the
in-memory pair and the Kafka pair (``KafkaRecordProducer``, ``SagaConsumer``) over a broker.

The ports are the runtime's: :class:`processor._ports.RecordProducer` and
:class:`processor._ports.RecordConsumer`. In memory there is no broker between the two, so the
memory backend plays it: what the producer acknowledged is appended to the consumers' partitions
(to the record's partition), and its assignment is handed over as a rebalance would. The memory
producer has no size limit of its own; the backend refuses records over the limit as the broker's
client does (permanently).

Both must agree: a partition's records come in order, with their offsets, key, headers and value
intact; an assignment starts where the assignment callback says; a seek reads again from an
offset; a paused partition is not read until resumed; the end of a partition is reported once;
a record over the size limit fails permanently while the rest of its batch is delivered; leaving
the group revokes the partitions and rejoining assigns them again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol

import pytest

from processor._engine.records import OutboxRow, Record
from processor._memory.consumer import MemoryRecordConsumer
from processor._memory.producer import MemoryRecordProducer
from processor._ports import TP, RecordConsumer, RecordProducer
from tests.support.harness import wait_until

LIMIT = 10_000  # the producer's largest record, in bytes
OnAssign = Callable[[list[TP]], Mapping[TP, int | None]]
OnRevoke = Callable[[list[TP]], None]


class Bus(Protocol):
    producer: RecordProducer

    def topic(self, partitions: int = 1) -> str:
        """A topic of this test's own."""
        ...

    def consumer(self, topic: str, on_assign: OnAssign, on_revoke: OnRevoke) -> RecordConsumer:
        """A member of a group of its own, subscribed to ``topic``."""
        ...

    def deliver(self) -> None:
        """Moves what the producer acknowledged to the consumers (a broker does it by itself)."""
        ...

    def close(self) -> None: ...


class MemoryBus:
    def __init__(self) -> None:
        self.memory = MemoryRecordProducer()
        self.memory.fail(
            where=lambda r: len(r.value) + len(r.key or b"") > LIMIT,
            permanent=True,
            reason="record too large",
        )
        self.producer: RecordProducer = self.memory
        self.partitions: dict[str, int] = {}
        self.members: list[tuple[str, MemoryRecordConsumer]] = []
        self.delivered = 0

    def topic(self, partitions: int = 1) -> str:
        name = f"t-{uuid.uuid4().hex[:8]}"
        self.partitions[name] = partitions
        return name

    def consumer(self, topic: str, on_assign: OnAssign, on_revoke: OnRevoke) -> RecordConsumer:
        member = MemoryRecordConsumer(on_assign, on_revoke)
        for row in self.memory.sent[: self.delivered]:
            self._append(member, topic, row)
        self.members.append((topic, member))
        member.assign([(topic, p) for p in range(self.partitions[topic])])
        return member

    def deliver(self) -> None:
        fresh = self.memory.sent[self.delivered :]
        self.delivered += len(fresh)
        for row in fresh:
            for topic, member in self.members:
                self._append(member, topic, row)

    @staticmethod
    def _append(member: MemoryRecordConsumer, topic: str, row: OutboxRow) -> None:
        if row.topic != topic:
            return
        headers = [(k, v.encode() if isinstance(v, str) else v) for k, v in row.headers.items()]
        member.append(topic, row.partition or 0, row.value, key=row.key, headers=headers)

    def close(self) -> None:
        for _, member in self.members:
            member.close()
        self.memory.close(1.0)


class KafkaBus:
    def __init__(self, kafka: str, make_topic: Callable[..., str]) -> None:
        from processor._kafka.producer import KafkaRecordProducer, make_producer, relay_overrides

        self.kafka = kafka
        self.make_topic = make_topic
        self.producer: RecordProducer = KafkaRecordProducer(
            lambda: make_producer(
                {"bootstrap.servers": kafka}, partitioner="murmur2", **relay_overrides(LIMIT)
            )
        )
        self.members: list[RecordConsumer] = []

    def topic(self, partitions: int = 1) -> str:
        return self.make_topic(f"p{partitions}", partitions=partitions)

    def consumer(self, topic: str, on_assign: OnAssign, on_revoke: OnRevoke) -> RecordConsumer:
        from processor._kafka.client import SagaConsumer

        member = SagaConsumer(
            {"bootstrap.servers": self.kafka},
            group_id=f"contract-{uuid.uuid4().hex[:12]}",
            topics=[topic],
            on_assign=on_assign,
            on_revoke=on_revoke,
            session_timeout_ms=6000,
        )
        self.members.append(member)
        return member

    def deliver(self) -> None:
        pass

    def close(self) -> None:
        for member in self.members:
            member.close()
        self.producer.close(10.0)


@pytest.fixture(params=["memory", pytest.param("kafka", marks=pytest.mark.integration)])
def bus(request: pytest.FixtureRequest) -> Iterator[Bus]:
    made: Bus
    if request.param == "memory":
        made = MemoryBus()
    else:
        made = KafkaBus(
            request.getfixturevalue("kafka_bootstrap"), request.getfixturevalue("make_topic")
        )
    try:
        yield made
    finally:
        made.close()


class Member:
    """A consumer with the callbacks a worker gives it, recording what they were told."""

    def __init__(self, bus: Bus, topic: str, starts: Mapping[TP, int] | None = None) -> None:
        self.starts = dict(starts or {})
        self.assigned: list[list[TP]] = []
        self.revoked: list[list[TP]] = []
        self.records: list[Record] = []
        self.ends: dict[TP, int] = {}
        self.consumer = bus.consumer(topic, self._assign, self.revoked.append)

    def _assign(self, tps: list[TP]) -> Mapping[TP, int | None]:
        self.assigned.append(sorted(tps))
        return {tp: self.starts.get(tp) for tp in tps}

    def poll(self, timeout: float = 0.1) -> list[Record]:
        got = self.consumer.consume(100, timeout)
        self.records += got
        self.ends.update(self.consumer.ends())
        return got

    def until(self, check: Callable[[], bool], what: str) -> None:
        def polled() -> bool:
            self.poll()
            return check()

        wait_until(polled, 30, what)

    def take(self, n: int) -> list[Record]:
        """The next ``n`` records."""
        self.records.clear()
        self.until(lambda: len(self.records) >= n, f"{n} records")
        taken, self.records = self.records[:n], self.records[n:]
        return taken


def row(
    topic: str,
    partition: int | None,
    value: bytes,
    key: bytes | None = b"k",
    headers: Mapping[str, str] | None = None,
) -> OutboxRow:
    shown = dict(headers) if headers is not None else {"message-id": value.decode()[:20]}
    return OutboxRow("contract", "s-1", topic, key, shown, value, partition)


def send(bus: Bus, rows: Sequence[OutboxRow]) -> list[tuple[int, bool]]:
    """Sends ``rows``; (index, permanent) of each failure."""
    failures = bus.producer.send(rows, 20.0)
    bus.deliver()
    return [(f.index, f.permanent) for f in failures]


def seen(records: Sequence[Record]) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return [(r.partition, r.offset, r.key, r.value) for r in records]


# -- produced and consumed -----------------------------------------------------------------------


def test_a_partitions_records_come_in_order_with_key_headers_and_value_intact(bus: Bus) -> None:
    topic = bus.topic(partitions=2)
    odd = "é\u2028😀\"'\\"
    rows = [
        row(topic, 1, b"one", headers={"message-id": "m-1", "text": odd, "empty": ""}),
        row(topic, 0, b"zero", key=None),
        row(topic, 1, b"two", key=b"\x00\xff"),
        row(topic, 1, b"", headers={}),
        row(topic, 0, odd.encode(), key=b""),
    ]
    assert send(bus, rows) == []

    member = Member(bus, topic)
    got = member.take(5)

    by_partition = {p: [r for r in got if r.partition == p] for p in (0, 1)}
    assert seen(by_partition[1]) == [
        (1, 0, b"k", b"one"),
        (1, 1, b"\x00\xff", b"two"),
        (1, 2, b"k", b""),
    ]
    assert seen(by_partition[0]) == [(0, 0, None, b"zero"), (0, 1, b"", odd.encode())]
    assert {r.topic for r in got} == {topic}
    assert dict(by_partition[1][0].headers) == {
        "message-id": b"m-1",
        "text": odd.encode(),
        "empty": b"",
    }
    assert by_partition[1][2].headers == ()
    assert member.assigned == [[(topic, 0), (topic, 1)]]


def test_an_assignment_starts_where_the_callback_says(bus: Bus) -> None:
    topic = bus.topic()
    tp = (topic, 0)
    assert send(bus, [row(topic, 0, f"v{i}".encode()) for i in range(4)]) == []

    member = Member(bus, topic, starts={tp: 2})

    assert seen(member.take(2)) == [(0, 2, b"k", b"v2"), (0, 3, b"k", b"v3")]
    assert member.assigned == [[tp]]
    assert send(bus, [row(topic, 0, b"v4")]) == []
    assert seen(member.take(1)) == [(0, 4, b"k", b"v4")]


def test_a_seek_reads_again_and_a_paused_partition_waits_for_its_resume(bus: Bus) -> None:
    topic = bus.topic(partitions=2)
    a = (topic, 0)
    assert send(bus, [row(topic, 0, b"a0"), row(topic, 0, b"a1"), row(topic, 1, b"b0")]) == []
    member = Member(bus, topic)
    member.take(3)

    member.consumer.seek(a, 1)
    assert seen(member.take(1)) == [(0, 1, b"k", b"a1")]

    member.consumer.pause([a])
    assert send(bus, [row(topic, 0, b"a2"), row(topic, 1, b"b1")]) == []
    # The unpaused partition's record comes; the paused one's does not meanwhile.
    assert seen(member.take(1)) == [(1, 1, b"k", b"b1")]
    for _ in range(3):
        assert member.poll() == []
    member.consumer.resume([a])
    assert seen(member.take(1)) == [(0, 2, b"k", b"a2")]


def test_the_end_of_a_partition_is_reported_once_when_reached(bus: Bus) -> None:
    topic = bus.topic()
    tp = (topic, 0)
    assert send(bus, [row(topic, 0, b"v0"), row(topic, 0, b"v1")]) == []
    member = Member(bus, topic)

    member.until(lambda: tp in member.ends, "the end of the partition")
    assert member.ends == {tp: 2}
    assert [r.offset for r in member.records] == [0, 1]
    assert member.consumer.ends() == {}

    member.ends.clear()
    assert send(bus, [row(topic, 0, b"v2")]) == []
    member.until(lambda: tp in member.ends, "the new end of the partition")
    assert member.ends == {tp: 3}
    # A seek forgets an end not yet asked for.
    member.consumer.seek(tp, 0)
    assert member.consumer.ends() == {}


def test_the_end_of_an_empty_partition_is_reported_at_its_start(bus: Bus) -> None:
    topic = bus.topic(partitions=2)
    assert send(bus, [row(topic, 0, b"v0")]) == []
    member = Member(bus, topic)

    member.until(lambda: len(member.ends) == 2, "the end of both partitions")
    assert member.ends == {(topic, 0): 1, (topic, 1): 0}


def test_a_record_over_the_size_limit_fails_for_good_and_the_rest_is_delivered(
    bus: Bus,
) -> None:
    topic = bus.topic()
    big = b"x" * (2 * LIMIT)
    rows = [row(topic, 0, b"before"), row(topic, 0, big), row(topic, 0, b"after")]

    assert send(bus, rows) == [(1, True)]

    member = Member(bus, topic)
    assert seen(member.take(2)) == [(0, 0, b"k", b"before"), (0, 1, b"k", b"after")]
    # The producer goes on after the refusal.
    assert send(bus, [row(topic, 0, b"later")]) == []
    assert seen(member.take(1)) == [(0, 2, b"k", b"later")]


def test_leaving_revokes_every_partition_and_rejoining_assigns_them_again(bus: Bus) -> None:
    topic = bus.topic(partitions=2)
    tps = [(topic, 0), (topic, 1)]
    assert send(bus, [row(topic, 0, b"a0"), row(topic, 1, b"b0")]) == []
    member = Member(bus, topic)
    member.take(2)

    member.consumer.leave()
    member.until(lambda: bool(member.revoked), "the revocation")
    assert [sorted(r) for r in member.revoked] == [tps]
    assert send(bus, [row(topic, 0, b"a1")]) == []
    for _ in range(3):
        assert member.poll() == []

    # The store holds the positions: the new assignment starts where the callback says.
    member.starts = {(topic, 0): 1, (topic, 1): 1}
    member.consumer.rejoin()
    assert seen(member.take(1)) == [(0, 1, b"k", b"a1")]
    assert [a for a in member.assigned if a] == [tps, tps]


def test_an_end_read_before_a_revocation_is_not_reported_after_the_next_assignment(
    bus: Bus,
) -> None:
    topic = bus.topic()
    assert send(bus, [row(topic, 0, b"v0"), row(topic, 0, b"v1")]) == []
    revoked: list[list[TP]] = []
    consumer = bus.consumer(topic, lambda tps: {tp: 0 for tp in tps}, revoked.append)
    got: list[Record] = []
    # Read to the end without asking for it: the end is noted, not yet taken.

    def read() -> bool:
        got.extend(consumer.consume(100, 0.1))
        return len(got) >= 2

    wait_until(read, 30, "the records")
    consumer.leave()
    wait_until(lambda: consumer.consume(100, 0.1) == [] and bool(revoked), 30, "the revocation")

    consumer.rejoin()
    again: list[Record] = []

    def read_one() -> bool:
        again.extend(consumer.consume(1, 0.1))
        # An end is only ever reported past what this assignment read again.
        for end in consumer.ends().values():
            assert end <= len(again), f"end {end} reported after reading {len(again)} again"
        return len(again) >= 2

    wait_until(read_one, 30, "the records read again")
