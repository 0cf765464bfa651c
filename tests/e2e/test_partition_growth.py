"""An input topic grown online (6 -> 12 partitions) under load, with two replicas running.

Producers key every event by saga id and leave the partition to librdkafka's default partitioner
(consistent_random: CRC32), as Python, Go and C services do; the processor runs with its default
`consumer.partitioner` (crc32). About half of the sagas move to a new partition when the topic
grows: their start event was sent to the old partition, their replies go to the new one. The
processor must still apply every saga's events in the order they were sent (no reply meets a
saga that does not exist yet), and fire the deadlines of moved sagas into their new partition,
once.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]

from processor.engine.partitioner import partition_for
from processor.messages import Message
from processor.wire import DEADLINE_FIRED, HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE
from schemas.transfers import CreditConfirmed, DebitConfirmed, TransferRequested
from tests.e2e.conftest import E2EEnv, log_lines
from tests.support.harness import Reader, headers_for, wait_until
from tests.support.procs import ProcessorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

OLD, NEW = 6, 12
AMOUNT = Decimal("10.00")
# Producers refresh their metadata every second; the grace covers it with room to spare.
GROWTH = {"growth_grace": "3s", "growth_check_interval": "500ms", "batch_size": 200}


class Producers:
    """Upstream services keying events by saga id with the client's default partitioner."""

    def __init__(self, kafka: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(
            {
                "bootstrap.servers": kafka,
                "enable.idempotence": True,
                "linger.ms": 5,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self.errors: list[KafkaError] = []
        # Per saga, the message ids sent, in send order.
        self.sent: dict[str, list[str]] = defaultdict(list)
        self.count = 0
        self.highest = -1

    def send(self, saga_id: str, message: Message) -> None:
        mid = str(uuid.uuid4())
        self.producer.produce(
            self.topic,
            key=saga_id.encode(),
            value=message.model_dump_json().encode(),
            headers=[*headers_for(message, mid)],
            on_delivery=self._delivered,
        )
        self.sent[saga_id].append(mid)
        self.count += 1
        self.producer.poll(0)

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


def requested(tid: str) -> TransferRequested:
    return TransferRequested(
        transfer_id=tid, source_account_id="A", target_account_id="B", amount=AMOUNT
    )


def start_in_background(producers: Producers, ids: list[str]) -> threading.Thread:
    """Sends the start events from a thread, so the topic grows while they are being sent."""

    def run() -> None:
        for i, tid in enumerate(ids, start=1):
            producers.send(tid, requested(tid))
            if i % 200 == 0:
                # About 2,000 sagas a second, so the stream spans the growth and the moment
                # the producer switches to the new partitions.
                time.sleep(0.1)

    thread = threading.Thread(target=run, name="start-events", daemon=True)
    thread.start()
    return thread


def grow(env: E2EEnv, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": env.kafka})
    for future in admin.create_partitions([NewPartitions(env.events_topic, partitions)]).values():
        future.result(30)


def send_replies(producers: Producers, ids: list[str]) -> None:
    for tid in ids:
        producers.send(tid, DebitConfirmed(transfer_id=tid, account_id="A", amount=AMOUNT))
    for tid in ids:
        producers.send(tid, CreditConfirmed(transfer_id=tid, account_id="B", amount=AMOUNT))
    producers.flush()


def history(env: E2EEnv) -> dict[str, list[tuple[Any, ...]]]:
    """Per saga: (message id, kind, outcome, partition) of each history row, in id order."""
    out: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for saga_id, mid, kind, outcome, partition in env.query(
        "SELECT saga_id, message_id, kind, outcome, partition FROM saga_history ORDER BY id"
    ):
        out[saga_id].append((mid, kind, outcome, partition))
    return out


def moved(tid: str) -> bool:
    return partition_for(tid.encode(), NEW, "crc32") != partition_for(tid.encode(), OLD, "crc32")


def assert_in_order(env: E2EEnv, producers: Producers, replied: list[str]) -> None:
    """Every replied saga applied exactly what was sent, in send order; nothing was refused."""
    assert env.query("SELECT DISTINCT outcome FROM saga_history") == [("applied",)]
    rows = history(env)
    for tid in replied:
        assert [r[0] for r in rows[tid]] == producers.sent[tid], tid
    # The barrier was exercised: sagas started on an old partition and went on on a new one.
    crossed = [
        tid for tid in replied if rows[tid][0][3] < OLD and any(r[3] >= OLD for r in rows[tid])
    ]
    assert len(crossed) > 100, len(crossed)


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
    replied: list[str],
    total: int,
) -> None:
    """Once the producer switched: replies to ``replied``, every saga ends, all in order."""
    wait_until(producers.switched, 30, "the producer sending to new partitions")
    starting.join(60)
    assert not starting.is_alive()
    producers.flush()
    send_replies(producers, replied)

    wait_until(
        lambda: env.scalar("SELECT count(*) FROM saga_instance WHERE status = 'ended'") == total,
        90,
        "every saga ended",
    )
    assert_in_order(env, producers, replied)
    assert_commands_in_order(env, commands, replied)


def _assigned(proc: ProcessorProcess) -> Callable[[], list[str]]:
    return lambda: log_lines(proc, r"assigned \[\(")


def start_replicas(env: E2EEnv, **settings: Any) -> list[ProcessorProcess]:
    settings.setdefault("consumer", GROWTH)
    procs = [env.start(name, **settings) for name in ("a", "b")]
    for proc in procs:
        wait_until(_assigned(proc), 60, "partitions for each replica")
    return procs


def test_growth_under_load_keeps_per_saga_order_and_reroutes_deadlines(e2e_env: E2EEnv) -> None:
    env = e2e_env
    sagas = [f"g-{uuid.uuid4().hex[:6]}-{i:04d}" for i in range(5000)]
    # Never replied to: their payment timeout is pending while the topic grows, and comes due
    # after it. They start first, so they are all on the old partitions.
    silent, replied = sagas[:150], sagas[150:]
    replicas = start_replicas(env, settings={"transfer.payment-timeout": 28})
    commands = env.reader()
    producers = Producers(env.kafka, env.events_topic)

    starting = start_in_background(producers, sagas)
    wait_until(lambda: producers.count >= 1500, 30, "1500 start events sent")
    grow(env, NEW)
    finish(env, producers, starting, commands, replied, len(sagas))
    rows = history(env)
    for tid in silent:
        [(start, *_), (_, kind, _, partition)] = rows[tid]
        assert start == producers.sent[tid][0]
        # Fired once, where the saga's events go now.
        assert kind == "deadline", rows[tid]
        assert partition == partition_for(tid.encode(), NEW, "crc32"), (tid, rows[tid])
    moved_silent = [tid for tid in silent if moved(tid)]
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

    [(old, new, marks, passed)] = env.query(
        "SELECT old_count, new_count, watermarks, passed_at FROM partition_growth"
    )
    assert (old, new) == (OLD, NEW)
    assert marks is not None
    assert passed is not None
    logs = "".join(p.log() for p in replicas)
    assert f"grew from {OLD} to {NEW} partitions" in logs
    assert "growth barrier taken" in logs
    assert "released after a growth" in logs
    assert all(p.alive() for p in replicas)


def test_a_replica_killed_during_the_growth_loses_nothing(e2e_env: E2EEnv) -> None:
    env = e2e_env
    sagas = [f"k-{uuid.uuid4().hex[:6]}-{i:04d}" for i in range(4000)]
    a, b = start_replicas(env, consumer={**GROWTH, "growth_grace": "8s"})
    commands = env.reader()
    producers = Producers(env.kafka, env.events_topic)

    starting = start_in_background(producers, sagas)
    wait_until(lambda: producers.count >= 500, 30, "500 start events sent")
    grow(env, NEW)
    wait_until(
        lambda: env.query("SELECT passed_at FROM partition_growth") == [(None,)],
        30,
        "the growth noticed",
    )
    # Killed before the barrier passes: whatever it held (old partitions mid-drain, new ones
    # waiting) goes to the survivor and a replacement.
    b.signal(signal.SIGKILL)
    wait_until(lambda: not b.alive(), 10, "the kill")
    assert env.query("SELECT passed_at FROM partition_growth") == [(None,)]
    env.start("c", consumer=GROWTH)
    finish(env, producers, starting, commands, sagas, len(sagas))
    wait_until(
        lambda: env.query("SELECT passed_at IS NOT NULL FROM partition_growth") == [(True,)],
        30,
        "the barrier passed",
    )
    assert a.alive()
