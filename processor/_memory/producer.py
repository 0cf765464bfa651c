"""An in-memory record producer that keeps what it sent and fails on request."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from processor._engine.records import OutboxRow
from processor._errors import Retryable, SendFailure

__all__ = ["MemoryRecordProducer"]


@dataclass
class _Fault:
    matches: Callable[[OutboxRow], bool]
    permanent: bool
    reason: str
    times: int | None


class MemoryRecordProducer:
    """:class:`processor._ports.RecordProducer` in memory.

    Each acknowledged record is appended to :attr:`sent` under its topic, in the order sent. As
    with Kafka, the records of a batch that are not refused are delivered even when others are,
    so a caller that sends the whole batch again produces duplicates.

    Attributes:
        sent: Every acknowledged record, in the order sent.
        calls: How many times :meth:`send` was called.
        closed: Whether :meth:`close` was called.
    """

    def __init__(self) -> None:
        self.sent: list[OutboxRow] = []
        self._by_topic: defaultdict[str, list[OutboxRow]] = defaultdict(list)
        self.calls = 0
        self.closed = False
        self._faults: list[_Fault] = []
        self._raise_next = 0
        self._lock = threading.Lock()

    def fail(
        self,
        *,
        topic: str | None = None,
        where: Callable[[OutboxRow], bool] | None = None,
        permanent: bool = False,
        times: int | None = None,
        reason: str = "injected failure",
    ) -> None:
        """Refuses the matching records from now on.

        Args:
            topic: Refuse records for this topic (with ``where``: both must match).
            where: Refuse records for which this returns True.
            permanent: Report the failures as permanent (sending again cannot succeed).
            times: Refuse this many matching records, then accept again; None: always.
            reason: The text of each failure.
        """

        def matches(row: OutboxRow) -> bool:
            return (topic is None or row.topic == topic) and (where is None or where(row))

        if times is not None and times < 1:
            raise ValueError("times must be at least 1, or None for always")
        with self._lock:
            self._faults.append(_Fault(matches, permanent, reason, times))

    def fail_next(self, n: int, permanent: bool = False) -> None:
        """Refuses the next ``n`` records, whatever their topic."""
        self.fail(times=n, permanent=permanent)

    def raise_retryable(self, times: int = 1) -> None:
        """The next ``times`` calls to :meth:`send` raise ``Retryable`` and deliver nothing."""
        with self._lock:
            self._raise_next += times

    def records(self, topic: str) -> list[OutboxRow]:
        """Acknowledged records for ``topic``, in order."""
        with self._lock:
            return list(self._by_topic.get(topic, ()))

    on_topic = records

    def send(self, records: Sequence[OutboxRow], timeout: float) -> list[SendFailure]:
        with self._lock:
            self.calls += 1
            if self._raise_next:
                self._raise_next -= 1
                raise Retryable("injected producer failure")
            failures: list[SendFailure] = []
            for index, row in enumerate(records):
                fault = self._fault_for(row)
                if fault is not None:
                    failures.append(SendFailure(index, fault.reason, fault.permanent))
                else:
                    self.sent.append(row)
                    self._by_topic[row.topic].append(row)
            return failures

    def _fault_for(self, row: OutboxRow) -> _Fault | None:
        for fault in self._faults:
            if fault.matches(row):
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times == 0:
                        self._faults.remove(fault)
                return fault
        return None

    def close(self, timeout: float) -> None:
        self.closed = True
