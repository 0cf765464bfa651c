"""A participant service's batch when some of its partitions cannot commit: the others go on.

With the tables distributed by bucket, a Citus worker that stops fails the transactions of the
commands whose buckets it holds, while the coordinator answers. The batch then goes on
partition by partition: each partition's records commit or wait together, and a partition that
waits is rewound to its first record not handled. A database that does not answer at all
(``Unreachable``) holds back the whole batch at once, without a transaction per partition.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from processor._authoring.messages import Message, MessageRegistry, message_type
from processor._engine.records import Record
from processor._errors import Retryable, Unreachable
from processor._memory.consumer import MemoryRecordConsumer
from processor._memory.outbox import MemoryOutboxStore
from processor._memory.participant import MemoryParticipantStore
from processor._memory.producer import MemoryRecordProducer
from processor._ports import TP
from processor._ports.participant import ParticipantTx
from processor._runtime.participant.service import ParticipantRuntime
from processor._runtime.relay import Relay
from processor.participant import Replies, command_handler, participant
from tests.support.harness import wait_until

REG = MessageRegistry()
TOPIC = "p.cmds"


@message_type("tp.Reserve", topic="cmds", registry=REG)
class Reserve(Message):
    order_id: str


@message_type("tp.Reserved", topic="events", registry=REG)
class Reserved(Message):
    order_id: str


@participant(name="stock")
class Stock:
    @command_handler
    def reserve(self, command: Reserve, replies: Replies) -> None:
        replies.send(Reserved(order_id=command.order_id))


class PartlyDown:
    """A memory store whose transactions fail once they touch a partition of ``down``.

    As a Citus coordinator answers for a stopped worker: the transaction fails (``Retryable``)
    and rolls back, and the next one may go to another worker. With ``unreachable`` set, every
    transaction fails at its start, as against a database that does not answer.
    """

    def __init__(self) -> None:
        self.inner = MemoryParticipantStore()
        self.down: set[int] = set()
        self.unreachable = False
        self.attempts = 0

    def positions(self, group_id: str, partitions: Sequence[TP]) -> Mapping[TP, int | None]:
        return self.inner.positions(group_id, partitions)

    @contextmanager
    def transaction(self) -> Iterator[ParticipantTx]:
        self.attempts += 1
        if self.unreachable:
            raise Unreachable("database unavailable: connection refused")
        with self.inner.transaction() as tx:
            yield _Guarded(tx, self.down)

    def close(self) -> None:
        pass

    def handled(self) -> dict[str, int]:
        """Each handled command's message id, with how many replies it has in the outbox."""
        sent: dict[str, int] = {}
        for row in self.inner.tables.outbox:
            sent[row.headers["causation-id"]] = sent.get(row.headers["causation-id"], 0) + 1
        return {mid: sent.get(mid, 0) for mid in self.inner.tables.inbox}


class _Guarded:
    def __init__(self, tx: Any, down: set[int]) -> None:
        self._tx = tx
        self._down = down

    def advance(self, group_id: str, topic: str, partition: int, next_offset: int) -> None:
        if partition in self._down:
            raise Retryable("a Citus worker's connection failed (XX000): connection refused")
        self._tx.advance(group_id, topic, partition, next_offset)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)


class _Quiet:
    def run(self, stop: threading.Event, on_wake: Callable[[], None]) -> None:
        stop.wait()


def _command(partition: int, offset: int) -> Record:
    mid = f"m-{partition}-{offset}"
    headers = {
        "message-id": mid,
        "message-type": "tp.Reserve",
        "saga-type": "order-saga",
        "saga-id": f"o-{partition}-{offset}",
        "correlation-id": mid,
    }
    body = Reserve(order_id=f"o-{partition}-{offset}").model_dump_json().encode()
    key = f"o-{partition}".encode()
    return Record(
        TOPIC, partition, offset, key, body, tuple((k, v.encode()) for k, v in headers.items())
    )


def _runtime(store: PartlyDown, consumer: MemoryRecordConsumer | None = None) -> ParticipantRuntime:
    def member(group: str, topics: Sequence[str], on_assign: Any, on_revoke: Any) -> Any:
        assert consumer is not None
        consumer.on_assign, consumer.on_revoke = on_assign, on_revoke
        consumer.assign([(TOPIC, 0), (TOPIC, 1)])
        return consumer

    return ParticipantRuntime(
        [Stock()],
        store=store,
        relay=Relay(MemoryOutboxStore(), MemoryRecordProducer()),
        wake_source=_Quiet(),
        consumer=member,
        schema="stock",
        group_id="g",
        topic_prefix="p.",
        message_registry=REG,
    )


# Two partitions' commands, interleaved as a consumer hands them over.
BATCH = [_command(p, o) for o in range(3) for p in (0, 1)]


@pytest.fixture
def store() -> PartlyDown:
    return PartlyDown()


def test_a_partition_that_cannot_commit_waits_while_the_others_commit(
    store: PartlyDown, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = _runtime(store)
    store.down = {0}
    assert not runtime.handle_batch(BATCH)
    # The command it waits at, named with its saga (never its payload).
    assert "command m-0-0 (saga order-saga o-0-0) at p.cmds[0] offset 0" in caplog.text
    # Partition 1's commands committed, each once with its reply; partition 0's none.
    assert store.handled() == {f"m-1-{o}": 1 for o in range(3)}
    assert store.inner.tables.offsets == {("g", TOPIC, 1): 3}
    # The batch, then each partition's records in a transaction of their own.
    assert store.attempts == 3

    store.down = set()
    assert runtime.handle_batch(BATCH[0::2])
    assert store.handled() == {f"m-{p}-{o}": 1 for p in (0, 1) for o in range(3)}
    assert store.inner.tables.offsets == {("g", TOPIC, 0): 3, ("g", TOPIC, 1): 3}


def test_a_database_that_does_not_answer_holds_the_whole_batch_back_at_once(
    store: PartlyDown,
) -> None:
    runtime = _runtime(store)
    store.unreachable = True
    assert not runtime.handle_batch(BATCH)
    # No transaction per partition: each would wait for its connection in vain.
    assert store.attempts == 1
    assert store.inner.tables.inbox == {}


def test_the_loop_rewinds_only_the_waiting_partition_and_ends_with_each_command_once(
    store: PartlyDown,
) -> None:
    consumer = MemoryRecordConsumer()
    for record in BATCH:
        consumer.append(
            TOPIC, record.partition, record.value, key=record.key, headers=record.headers
        )
    runtime = _runtime(store, consumer)
    store.down = {0}
    stop = threading.Event()
    loop = threading.Thread(target=runtime.run, args=(stop,), daemon=True)
    loop.start()
    try:
        wait_until(lambda: len(store.handled()) == 3, 10, what="partition 1's commands")
        assert set(store.handled()) == {f"m-1-{o}" for o in range(3)}
        wait_until(lambda: runtime.failing > 0, 10, what="a failed batch")
        # Partition 0 is read again from its first command; partition 1 is never rewound.
        assert {tp for tp, _ in consumer.seeks} == {(TOPIC, 0)}
        store.down = set()
        wait_until(lambda: len(store.handled()) == 6, 10, what="every command")
        assert store.handled() == {f"m-{p}-{o}": 1 for p in (0, 1) for o in range(3)}
        wait_until(lambda: runtime.failing == 0, 10, what="a batch that committed")
    finally:
        stop.set()
        loop.join(10)
    assert not loop.is_alive()
