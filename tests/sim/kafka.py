"""The Kafka adapter itself (``SagaConsumer``) over a simulated librdkafka consumer.

The simulated replicas read through the production adapter, so its own fixes (an end read
before a revocation forgotten with it, a refused seek tried again) are part of what a run
checks. Below it, :class:`SimClient` stands in for ``confluent_kafka.Consumer`` with the
behaviour the adapter depends on:

- rebalance callbacks (assigned, revoked, lost) run inside ``consume``, when the member next
  polls, not when the group decides: a member paused past its session learns that it lost its
  partitions only at its next poll, after whatever it did first;
- a member whose partitions were lost joins again by itself while it is subscribed;
- a partition's end comes as a ``_PARTITION_EOF`` message, once each time it is reached;
- a seek can be refused (``KafkaException``), leaving the fetch where it was;
- records of several partitions come interleaved in an order the scheduler draws.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from processor._engine.records import Record
from processor._kafka.client import SagaConsumer
from processor._ports import TP

if TYPE_CHECKING:
    from tests.sim.world import Broker, Faults, Group

__all__ = ["SimClient", "SimSagaConsumer"]

Callback = Callable[[Any, list[TopicPartition]], None]


class _Message:
    """A record, or a partition's end, as ``consume`` hands it out."""

    __slots__ = ("_error", "_offset", "_record", "_tp")

    def __init__(self, record: Record | None, tp: TP, offset: int, error: KafkaError | None):
        self._record = record
        self._tp = tp
        self._offset = offset
        self._error = error

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str:
        return self._tp[0]

    def partition(self) -> int:
        return self._tp[1]

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._record.key if self._record is not None else None

    def value(self) -> bytes | None:
        return self._record.value if self._record is not None else None

    def headers(self) -> list[tuple[str, bytes]] | None:
        if self._record is None or not self._record.headers:
            return None
        return list(self._record.headers)

    def timestamp(self) -> tuple[int, int]:
        return (0, 0)


class SimClient:
    """A group member's librdkafka consumer over the simulated broker and coordinator."""

    def __init__(
        self, broker: Broker, group: Group, member: str, faults: Faults, rng: random.Random
    ) -> None:
        self._broker = broker
        self._group = group
        self.member = member
        self._faults = faults
        self._rng = rng
        self.subscribed = False
        self.closed = False
        self._callbacks: dict[str, Callback] = {}
        # Rebalance events the group decided, run at the next consume, in order.
        self._events: list[tuple[str, list[TP]]] = []
        self._positions: dict[TP, int] = {}
        self._paused: set[TP] = set()
        self._at_end: set[TP] = set()

    # -- what the group does to it ---------------------------------------------------------------

    def group_event(self, kind: str, tps: Sequence[TP]) -> None:
        """The coordinator's decision (assigned, revoked or lost), seen at the next consume."""
        self._events.append((kind, list(tps)))

    def assignment_now(self) -> list[TP]:
        return sorted(self._positions)

    # -- confluent_kafka.Consumer --------------------------------------------------------------

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callback,
        on_revoke: Callback,
        on_lost: Callback,
    ) -> None:
        self._callbacks = {"assigned": on_assign, "revoked": on_revoke, "lost": on_lost}
        self.subscribed = True
        self._group.join(self.member)

    def unsubscribe(self) -> None:
        self.subscribed = False
        self._group.leave(self.member)

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        if self.closed:
            raise RuntimeError("consumer closed")
        while self._events:
            kind, tps = self._events.pop(0)
            callback = self._callbacks.get(kind)
            parts = [TopicPartition(t, p) for t, p in tps]
            if callback is not None and parts:
                callback(self, parts)
            if kind == "lost" and self.subscribed:
                # The client joins again on its own after its session expired.
                self._group.join(self.member)
        out: list[_Message] = []
        tps = sorted(tp for tp in self._positions if tp not in self._paused)
        self._rng.shuffle(tps)
        for tp in tps:
            room = num_messages - len(out)
            if room <= 0:
                break
            log = self._broker.logs.get(tp, [])
            start = self._positions[tp]
            take = self._rng.randint(1, room)
            taken = log[start : start + take]
            markers = self._broker.markers.get(tp, set())
            out.extend(_Message(r, tp, r.offset, None) for r in taken if r.offset not in markers)
            position = self._positions[tp] = start + len(taken)
            if taken:
                self._at_end.discard(tp)
            if position >= len(log) and tp not in self._at_end:
                self._at_end.add(tp)
                out.append(_Message(None, tp, position, KafkaError(KafkaError._PARTITION_EOF)))
        return out

    def poll(self, timeout: float) -> _Message | None:
        # The adapter waits here only after a read found nothing. No time passes within a
        # call, so a wait finds nothing that read did not: records come through consume, and
        # events queued meanwhile are served at the next read, as before the wait.
        if self.closed:
            raise RuntimeError("consumer closed")
        return None

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            tp = (p.topic, p.partition)
            self._positions[tp] = 0 if p.offset == OFFSET_BEGINNING else p.offset
            self._at_end.discard(tp)

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            tp = (p.topic, p.partition)
            self._positions.pop(tp, None)
            self._at_end.discard(tp)

    def seek(self, partition: TopicPartition) -> None:
        tp = (partition.topic, partition.partition)
        if tp not in self._positions:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        if self._faults.take_seek(self.member):
            # The fetch of a partition just assigned has not started: the seek does not take.
            raise KafkaException(KafkaError(KafkaError._STATE))
        offset = partition.offset
        self._positions[tp] = 0 if offset == OFFSET_BEGINNING else offset
        self._at_end.discard(tp)

    def pause(self, partitions: list[TopicPartition]) -> None:
        self._paused.update((p.topic, p.partition) for p in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self._paused.difference_update((p.topic, p.partition) for p in partitions)

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        return None

    def close(self) -> None:
        if self.subscribed:
            self.unsubscribe()
        self.closed = True


class _Lazy:
    """``LazyConsumer`` over one :class:`SimClient`."""

    def __init__(self, client: SimClient) -> None:
        self.client = client
        self.made: SimClient | None = None

    def get(self) -> SimClient:
        self.made = self.client
        return self.client

    def replace(self) -> SimClient:
        raise AssertionError("the membership watch is not simulated")

    def close(self) -> None:
        self.client.close()


class SimSagaConsumer(SagaConsumer):
    """The production adapter with :class:`SimClient` as its librdkafka consumer."""

    def __init__(self, client: SimClient, on_assign: Any, on_revoke: Any) -> None:
        super().__init__(
            {"bootstrap.servers": "sim"},
            group_id="sim",
            topics=sorted({t for t, _ in client._broker.input_partitions()}),
            on_assign=on_assign,
            on_revoke=on_revoke,
        )
        self.client = client
        self._client = _Lazy(client)  # type: ignore[assignment]

    def _watch_membership(self) -> None:
        # Works around a librdkafka client that never rejoins; the simulated one always does.
        return None
