"""An in-memory consumer group member: partitions as lists, rebalances driven by the test.

Positions come from the rebalance callback (the store), as with the Kafka adapter; Kafka's own
committed offsets are only recorded, never read back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from processor._engine.records import Record
from processor._ports import TP

__all__ = ["MemoryRecordConsumer"]

OnAssign = Callable[[list[TP]], Mapping[TP, int | None]]
OnRevoke = Callable[[list[TP]], None]


class MemoryRecordConsumer:
    """:class:`processor._ports.RecordConsumer` over in-memory partitions.

    Records are appended per (topic, partition) and get consecutive offsets from 0. Nothing is
    read until partitions are assigned: :meth:`assign` and :meth:`revoke` call the callbacks the
    way a rebalance does, and an assigned partition starts at the offset ``on_assign`` returns
    (its beginning when that is None). Thread-safe: records may be appended from another thread
    while :meth:`consume` waits.

    Args:
        on_assign: The member's assignment callback (e.g. ``Worker.on_assign``); it may also be
            set later through :attr:`on_assign`.
        on_revoke: The member's revocation callback (e.g. ``Worker.on_revoke``).

    Attributes:
        advisory: Every ``commit_advisory`` call's offsets, in order.
        seeks: Every ``seek`` call, in order.
        closed: Whether :meth:`close` was called.
    """

    def __init__(self, on_assign: OnAssign | None = None, on_revoke: OnRevoke | None = None):
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        self._logs: dict[TP, list[Record]] = {}
        # Next offset to read, per assigned partition.
        self._positions: dict[TP, int] = {}
        self._paused: set[TP] = set()
        self._changed = threading.Condition()
        self.advisory: list[dict[TP, int]] = []
        self.seeks: list[tuple[TP, int | None]] = []
        self.closed = False
        self._left: list[TP] = []
        # Control records (transaction markers): offsets consume() skips, as Kafka's does.
        self._markers: dict[TP, set[int]] = {}
        self._ends: dict[TP, int] = {}
        # Partitions whose current end was reported: as librdkafka's partition EOF, an end is
        # reported once when a read reaches it (an empty partition's too), again after new records.
        self._at_end: set[TP] = set()

    # -- for tests ---------------------------------------------------------------------------

    def append(
        self,
        topic: str,
        partition: int,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Iterable[tuple[str, bytes]] = (),
        timestamp_ms: int | None = None,
    ) -> Record:
        """Appends a record to a partition, as a producer's acknowledged send would."""
        with self._changed:
            log = self._logs.setdefault((topic, partition), [])
            record = Record(topic, partition, len(log), key, value, tuple(headers), timestamp_ms)
            log.append(record)
            self._changed.notify_all()
            return record

    def append_marker(self, topic: str, partition: int) -> int:
        """Appends a transaction marker: it takes an offset, and no read ever returns it."""
        with self._changed:
            log = self._logs.setdefault((topic, partition), [])
            offset = len(log)
            log.append(Record(topic, partition, offset, None, None, ()))
            self._markers.setdefault((topic, partition), set()).add(offset)
            self._changed.notify_all()
            return offset

    def records(self, tp: TP) -> list[Record]:
        """Everything appended to a partition, in offset order."""
        with self._changed:
            return list(self._logs.get(tp, ()))

    def assign(self, tps: Sequence[TP]) -> None:
        """Adds partitions to the assignment, starting each where ``on_assign`` says."""
        if self.on_assign is None:
            raise RuntimeError("no on_assign callback to hand the partitions to")
        starts = self.on_assign(list(tps))
        with self._changed:
            for tp in tps:
                start = starts.get(tp)
                self._positions[tp] = 0 if start is None else start
                # A fresh assignment starts where the worker says; an end read before is not its.
                self._ends.pop(tp, None)
                self._at_end.discard(tp)
                # A fresh assignment is never paused, as with Kafka's incremental assign.
                self._paused.discard(tp)
            self._changed.notify_all()

    def revoke(self, tps: Sequence[TP]) -> None:
        """Takes partitions away, after telling ``on_revoke``."""
        if self.on_revoke is not None:
            self.on_revoke(list(tps))
        with self._changed:
            for tp in tps:
                self._positions.pop(tp, None)
                self._paused.discard(tp)
                # Forgotten with the partition, as by the Kafka adapter: a later assignment
                # starts from the worker's position, and an end read before would skip records.
                self._ends.pop(tp, None)
                self._at_end.discard(tp)

    def resume(self, tps: Sequence[TP]) -> None:
        """Undoes :meth:`pause`."""
        with self._changed:
            self._paused.difference_update(tps)
            self._changed.notify_all()

    def leave(self) -> None:
        """Leaves the group: every assigned partition is revoked, as the coordinator would."""
        self._left = self.assignment()
        self.revoke(self._left)

    def rejoin(self) -> None:
        """Joins again; as the group's only member it gets back what it held before leaving."""
        held, self._left = self._left, []
        if held:
            self.assign(held)

    def assignment(self) -> list[TP]:
        """The assigned partitions, in order."""
        with self._changed:
            return sorted(self._positions)

    def paused(self) -> list[TP]:
        """The paused partitions, in order."""
        with self._changed:
            return sorted(self._paused)

    def position(self, tp: TP) -> int | None:
        """The next offset :meth:`consume` reads from an assigned partition; None if unassigned."""
        with self._changed:
            return self._positions.get(tp)

    # -- the port ----------------------------------------------------------------------------

    def consume(self, max_records: int, timeout: float) -> list[Record]:
        """Up to ``max_records`` records from the assigned, unpaused partitions, in their order.

        Waits up to ``timeout`` seconds for a first record; returns at once when there is one.
        """
        with self._changed:
            if self.closed:
                raise RuntimeError("consumer closed")
            self._changed.wait_for(
                lambda: self.closed or self._available() > 0 or bool(self._unreported()), timeout
            )
            if self.closed:
                return []
            out: list[Record] = []
            for tp in sorted(self._positions):
                if tp in self._paused:
                    continue
                log = self._logs.get(tp, [])
                start = self._positions[tp]
                taken = log[start : start + max_records - len(out)]
                markers = self._markers.get(tp, set())
                out.extend(r for r in taken if r.offset not in markers)
                position = self._positions[tp] = start + len(taken)
                if taken:
                    self._at_end.discard(tp)
                if position >= len(log) and tp not in self._at_end:
                    self._ends[tp] = position
                    self._at_end.add(tp)
                if len(out) >= max_records:
                    break
            return out

    def ends(self) -> dict[TP, int]:
        """Partitions whose reads reached their end since the last call, and where."""
        with self._changed:
            ends, self._ends = self._ends, {}
            return ends

    def seek(self, tp: TP, offset: int | None) -> None:
        """Moves an assigned partition's position; None is its beginning. Others are ignored."""
        with self._changed:
            self.seeks.append((tp, offset))
            self._ends.pop(tp, None)
            self._at_end.discard(tp)
            # As with Kafka, seeking a partition not assigned (any more) has no effect.
            if tp in self._positions:
                self._positions[tp] = 0 if offset is None else offset
                self._changed.notify_all()

    def pause(self, tps: Sequence[TP]) -> None:
        with self._changed:
            self._paused.update(tps)

    def commit_advisory(self, offsets: Mapping[TP, int]) -> None:
        """Records the offsets in :attr:`advisory`; nothing reads them back."""
        with self._changed:
            self.advisory.append(dict(offsets))

    def close(self) -> None:
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    def _unreported(self) -> list[TP]:
        """Unpaused partitions read to their end whose end is not reported yet."""
        return [
            tp
            for tp, pos in self._positions.items()
            if tp not in self._paused
            and tp not in self._at_end
            and pos >= len(self._logs.get(tp, ()))
        ]

    def _available(self) -> int:
        return sum(
            len(self._logs.get(tp, ())) - pos
            for tp, pos in self._positions.items()
            if tp not in self._paused
        )
