"""An input topic grown online (6 -> 12 partitions) under load, with producers users have.

Two upstream producers key every event by saga id and leave the partition to their client: one
learns of the growth within a second, the other keeps its metadata for librdkafka's default 5
minutes (longer than the test), so it sends every saga to its old partition throughout. They
take turns sending the sagas' start events; each saga's debit and credit replies come from the
first, once its start was acknowledged. So a moved saga's start lands on its old partition
(sent before the growth, or after it by the stale producer) and its replies on its new one. The
processor must apply every saga's events in the order they were sent (no reply meets a saga that
does not exist yet, no record recorded `no-saga`), fire the deadlines of moved sagas into their
new partition once, and send each saga's commands in order. Run with librdkafka's default
partitioner (and the processor's default) and again with murmur2 on both sides, the second time
with a replica killed mid-growth.
"""

from __future__ import annotations

import itertools
import signal
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from decimal import Decimal
from functools import partial
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]

from processor._authoring.messages import Message
from processor._engine.partitioner import partition_for
from processor._wire import DEADLINE_FIRED, HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE
from schemas.transfers import CreditConfirmed, DebitConfirmed, TransferRequested
from tests.e2e.conftest import E2EEnv, log_lines
from tests.support.harness import Reader, headers_for, wait_until
from tests.support.procs import ProcessorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

OLD, NEW = 6, 12
AMOUNT = Decimal("10.00")
FAST = {"growth_check_interval": "500ms", "batch_size": 200}


class Producer1:
    """One upstream service keying events by saga id, leaving the partition to its client."""

    def __init__(
        self, kafka: str, topic: str, sent: dict[str, list[str]], partitioner: str, refresh: bool
    ) -> None:
        self.topic = topic
        config: dict[str, Any] = {
            "bootstrap.servers": kafka,
            "enable.idempotence": True,
            "linger.ms": 5,
        }
        if partitioner == "murmur2":
            config["partitioner"] = "murmur2_random"
        if refresh:
            config["topic.metadata.refresh.interval.ms"] = 1000
        self.producer = Producer(config)
        self.errors: list[KafkaError] = []
        self.sent = sent
        self.count = 0
        self.highest = -1

    def send(self, saga_id: str, message: Message, then: Callable[[], None] | None = None) -> str:
        """Sends ``message``; ``then`` runs once it is acknowledged (in a later poll)."""
        mid = str(uuid.uuid4())

        def delivered(err: KafkaError | None, msg: Any) -> None:
            self._delivered(err, msg)
            if err is None and then is not None:
                then()

        self.producer.produce(
            self.topic,
            key=saga_id.encode(),
            value=message.model_dump_json().encode(),
            headers=[*headers_for(message, mid)],
            on_delivery=delivered,
        )
        self.sent[saga_id].append(mid)
        self.count += 1
        self.producer.poll(0)
        return mid

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.highest = max(self.highest, msg.partition())

    def switched(self) -> bool:
        """Whether the producer has sent a record to a new partition (it knows the growth)."""
        self.producer.poll(0)
        return self.highest >= OLD

    def flush(self) -> None:
        assert self.producer.flush(30) == 0
        assert not self.errors, self.errors


class Producers:
    """A producer that learns of the growth at once and one that keeps its old metadata."""

    def __init__(self, kafka: str, topic: str, partitioner: str) -> None:
        self.sent: dict[str, list[str]] = defaultdict(list)
        self.fresh = Producer1(kafka, topic, self.sent, partitioner, refresh=True)
        self.stale = Producer1(kafka, topic, self.sent, partitioner, refresh=False)
        # Set once the topic has grown: the stale producer's start events sent after it.
        self.grown = False
        self.stale_after_growth: set[str] = set()
        # Sagas whose last reply was acknowledged.
        self.replied: set[str] = set()

    @property
    def count(self) -> int:
        return self.fresh.count + self.stale.count

    def starter(self, index: int) -> Producer1:
        return self.fresh if index % 2 == 0 else self.stale

    def switched(self) -> bool:
        return self.fresh.switched()

    def flush(self) -> None:
        self.fresh.flush()
        self.stale.flush()
        # The stale producer never learnt of the growth: all it sent is on old partitions.
        assert self.stale.highest < OLD, self.stale.highest


def requested(tid: str) -> TransferRequested:
    return TransferRequested(
        transfer_id=tid, source_account_id="A", target_account_id="B", amount=AMOUNT
    )


def traffic_in_background(
    producers: Producers, ids: list[str], replied: set[str]
) -> threading.Thread:
    """Sends the sagas' events from a thread, so the topic grows while they are being sent.

    A replied saga's debit reply is sent as soon as its start is acknowledged, and its credit
    as soon as the debit is: a reply often reaches its partition before the start is applied
    on another, which is what the processor must order. Past the sagas given, more (replied)
    ones follow, appended to ``ids`` and ``replied``, until the fresh producer has sent to the
    new partitions for a while: however long the growth takes to reach it, the stream spans it.
    """
    next_up: deque[tuple[str, str]] = deque()

    def pump() -> None:
        producers.fresh.producer.poll(0)
        producers.stale.producer.poll(0)
        while next_up:
            tid, kind = next_up.popleft()
            if kind == "debit":
                debit = DebitConfirmed(transfer_id=tid, account_id="A", amount=AMOUNT)
                producers.fresh.send(tid, debit, partial(next_up.append, (tid, "credit")))
            else:
                credit = CreditConfirmed(transfer_id=tid, account_id="B", amount=AMOUNT)
                producers.fresh.send(tid, credit, partial(producers.replied.add, tid))

    def more() -> Iterator[tuple[int, str]]:
        yield from enumerate(list(ids), start=1)
        after = 0
        for i in itertools.count(len(ids) + 1):
            if producers.switched():
                after += 1
            if after > 300 or i > 50_000:
                return
            tid = f"{ids[0].rsplit('-', 1)[0]}-x{i:05d}"
            ids.append(tid)
            replied.add(tid)
            yield i, tid

    def run() -> None:
        for i, tid in more():
            by = producers.starter(i)
            then = partial(next_up.append, (tid, "debit")) if tid in replied else None
            mid = by.send(tid, requested(tid), then)
            if by is producers.stale and producers.grown:
                producers.stale_after_growth.add(mid)
            pump()
            if i % 200 == 0:
                # About 2,000 sagas a second, so the stream spans the growth and the moment
                # the fresh producer switches to the new partitions.
                time.sleep(0.1)
        deadline = time.monotonic() + 60
        while len(producers.replied) < len(replied) and time.monotonic() < deadline:
            pump()
            time.sleep(0.01)

    thread = threading.Thread(target=run, name="traffic", daemon=True)
    thread.start()
    return thread


def grow(env: E2EEnv, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": env.kafka})
    for future in admin.create_partitions([NewPartitions(env.events_topic, partitions)]).values():
        future.result(30)


def history(env: E2EEnv) -> dict[str, list[tuple[Any, ...]]]:
    """Per saga: (message id, kind, outcome, partition) of each history row, in id order."""
    out: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for saga_id, mid, kind, outcome, partition in env.query(
        "SELECT saga_id, message_id, kind, outcome, partition FROM saga_history ORDER BY id"
    ):
        out[saga_id].append((mid, kind, outcome, partition))
    return out


def moved(tid: str, partitioner: str) -> bool:
    key = tid.encode()
    return partition_for(key, NEW, partitioner) != partition_for(key, OLD, partitioner)  # type: ignore[arg-type]


def assert_in_order(env: E2EEnv, producers: Producers, replied: list[str]) -> None:
    """Every replied saga applied exactly what was sent, in send order; nothing was refused."""
    assert env.query("SELECT DISTINCT outcome FROM saga_history") == [("applied",)]
    rows = history(env)
    for tid in replied:
        assert [r[0] for r in rows[tid]] == producers.sent[tid], tid
    # Sagas started on an old partition went on on a new one, some of them started there by the
    # stale producer after the growth.
    crossed = [tid for tid in replied if rows[tid][0][3] < OLD and rows[tid][1][3] >= OLD]
    assert len(crossed) > 100, len(crossed)
    late = [tid for tid in crossed if rows[tid][0][0] in producers.stale_after_growth]
    assert len(late) > 20, len(late)


def assert_commands_in_order(env: E2EEnv, reader: Reader, replied: list[str]) -> None:
    """Per saga, its debit reached the command topic before its credit, each under one id.

    The debit was caused on the saga's old partition and the credit, for a moved saga, on its new
    one: two relays, possibly in two replicas. Duplicates (a killed relay round) repeat an id.
    """

    def seen(records: list[Any]) -> dict[str, list[tuple[str, str]]]:
        out: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for m in records:
            h = reader.headers(m)
            out[m.key().decode()].append((h[HEADER_MESSAGE_TYPE], h[HEADER_MESSAGE_ID]))
        return out

    def credited(records: list[Any]) -> bool:
        by_saga = seen(records)
        return all(
            any(t == "transfers.CreditAccount" for t, _ in by_saga.get(tid, [])) for tid in replied
        )

    reader.wait_for(credited, 60, "every saga's credit command")
    by_saga = seen(reader.records)
    for tid in replied:
        firsts: list[str] = []
        ids: dict[str, str] = {}
        for kind, mid in by_saga[tid]:
            assert ids.setdefault(kind, mid) == mid, (tid, by_saga[tid])
            if kind not in firsts:
                firsts.append(kind)
        assert firsts == ["transfers.DebitAccount", "transfers.CreditAccount"], (tid, firsts)


def finish(
    env: E2EEnv,
    producers: Producers,
    starting: threading.Thread,
    commands: Reader,
    replied: set[str],
    sagas: list[str],
) -> list[str]:
    """Once the traffic is sent: every saga ends, each one's events applied in order.

    Returns the replied sagas (those given, and those the traffic added), in send order.
    """
    starting.join(120)
    assert not starting.is_alive()
    assert producers.switched()
    producers.flush()
    assert producers.replied == replied
    total = len(sagas)
    in_order = [tid for tid in sagas if tid in replied]

    wait_until(
        lambda: env.scalar("SELECT count(*) FROM saga_instance WHERE status = 'ended'") == total,
        90,
        "every saga ended",
    )
    assert_in_order(env, producers, in_order)
    assert_commands_in_order(env, commands, in_order)
    return in_order


def _assigned(proc: ProcessorProcess) -> Callable[[], list[str]]:
    return lambda: log_lines(proc, r"assigned \[\(")


def start_replicas(env: E2EEnv, **settings: Any) -> list[ProcessorProcess]:
    procs = [env.start(name, **settings) for name in ("a", "b")]
    for proc in procs:
        wait_until(_assigned(proc), 60, "partitions for each replica")
    return procs


def test_growth_with_default_clients_keeps_per_saga_order_and_reroutes_deadlines(
    e2e_env: E2EEnv,
) -> None:
    """Every setting at its default, the processor's and the producers' partitioner included."""
    env = e2e_env
    sagas = [f"g-{uuid.uuid4().hex[:6]}-{i:04d}" for i in range(3000)]
    # Never replied to: their payment timeout is pending while the topic grows, and comes due
    # after it. They start first, so they are all on the old partitions.
    silent, replied = sagas[:150], set(sagas[150:])
    replicas = start_replicas(env, settings={"transfer.payment-timeout": 11})
    commands = env.reader()
    producers = Producers(env.kafka, env.events_topic, "crc32")

    starting = traffic_in_background(producers, sagas, replied)
    wait_until(lambda: producers.count >= 1000, 30, "1000 start events sent")
    grow(env, NEW)
    producers.grown = True
    finish(env, producers, starting, commands, replied, sagas)
    rows = history(env)
    for tid in silent:
        [(start, *_), (_, kind, _, partition)] = rows[tid]
        assert start == producers.sent[tid][0]
        # Fired once, where the saga's events go now.
        assert kind == "deadline", rows[tid]
        assert partition == partition_for(tid.encode(), NEW, "crc32"), (tid, rows[tid])
    moved_silent = [tid for tid in silent if moved(tid, "crc32")]
    assert len(moved_silent) > 40, len(moved_silent)

    # The fired records themselves went to the new partitions, once each.
    inputs = Reader(env.kafka, [env.events_topic])
    env.readers.append(inputs)

    def fired() -> dict[str, list[int]]:
        out: dict[str, list[int]] = defaultdict(list)
        for m in inputs.records:
            if inputs.headers(m).get(HEADER_MESSAGE_TYPE) == DEADLINE_FIRED:
                out[m.key().decode()].append(m.partition())
        return out

    inputs.wait_for(lambda _: len(fired()) == len(silent), 60, "every fired record")
    assert fired() == {tid: [partition_for(tid.encode(), NEW, "crc32")] for tid in silent}

    [(old, new)] = env.query("SELECT old_count, new_count FROM partition_growth")
    assert (old, new) == (OLD, NEW)
    logs = "".join(p.log() for p in replicas)
    assert f"grew from {OLD} to {NEW} partitions" in logs
    # The stale producer's records are on partitions its keys hashed to at the old count: not
    # misplaced, but named as a producer that missed the growth, by a replica that knows of the
    # growth when it applies one. Its records in the traffic may all have been applied before
    # that (a replica loads the counts every few seconds, and a quick one keeps up with the
    # traffic): it goes on sending, a saga whose key moved at a time, until one is named.
    assert "not where SAGA_CONSUMER__PARTITIONER" not in logs
    prefix = sagas[0].rsplit("-", 1)[0]
    late = (t for i in itertools.count() if moved(t := f"{prefix}-late{i:04d}", "crc32"))

    def stale_named() -> bool:
        named = "come from a producer that has not learnt of its growth to 12"
        if any(named in p.log() for p in replicas):
            return True
        tid = next(late)
        producers.stale.send(tid, requested(tid))
        producers.stale.flush()
        return False

    wait_until(stale_named, 60, "the stale producer named by a replica")
    assert "not where SAGA_CONSUMER__PARTITIONER" not in "".join(p.log() for p in replicas)
    assert producers.stale.highest < OLD
    assert all(p.alive() for p in replicas)


def test_growth_with_murmur2_clients_and_a_replica_killed_loses_nothing(e2e_env: E2EEnv) -> None:
    env = e2e_env
    sagas = [f"k-{uuid.uuid4().hex[:6]}-{i:04d}" for i in range(3000)]
    consumer = {**FAST, "partitioner": "murmur2"}
    a, b = start_replicas(env, consumer=consumer)
    commands = env.reader()
    producers = Producers(env.kafka, env.events_topic, "murmur2")

    replied = set(sagas)
    starting = traffic_in_background(producers, sagas, replied)
    wait_until(lambda: producers.count >= 500, 30, "500 start events sent")
    grow(env, NEW)
    producers.grown = True
    wait_until(
        lambda: env.scalar("SELECT count(*) FROM partition_growth") == 1, 30, "the growth noticed"
    )
    # Killed mid-growth: whatever it held (old partitions mid-drain, new ones waiting on them)
    # goes to the survivor and a replacement.
    b.signal(signal.SIGKILL)
    wait_until(lambda: not b.alive(), 10, "the kill")
    env.start("c", consumer=consumer)
    finish(env, producers, starting, commands, replied, sagas)
    assert a.alive()
    assert "not where SAGA_CONSUMER__PARTITIONER" not in a.log()
