"""An in-memory record producer: keeps what was sent, fails records on request."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from processor.engine.records import OutboxRow
from processor.errors import SendFailure

__all__ = ["MemoryRecordProducer"]


class MemoryRecordProducer:
    """:class:`processor.ports.RecordProducer` that acknowledges into a list.

    Attributes:
        sent: Every acknowledged record, in send order.
    """

    def __init__(self) -> None:
        self.sent: list[OutboxRow] = []
        self._lock = threading.Lock()
        self._failing = 0
        self._permanent = False

    def fail_next(self, n: int, permanent: bool = False) -> None:
        """Leaves the next ``n`` records unacknowledged, refused for good when ``permanent``."""
        with self._lock:
            self._failing = n
            self._permanent = permanent

    def send(self, records: Sequence[OutboxRow], timeout: float) -> list[SendFailure]:
        """Acknowledges every record except those :meth:`fail_next` asked to fail."""
        failures: list[SendFailure] = []
        with self._lock:
            for index, record in enumerate(records):
                if self._failing > 0:
                    self._failing -= 1
                    failures.append(SendFailure(index, "injected failure", self._permanent))
                else:
                    self.sent.append(record)
        return failures

    def on_topic(self, topic: str) -> list[OutboxRow]:
        """The acknowledged records of ``topic``, in send order."""
        with self._lock:
            return [r for r in self.sent if r.topic == topic]

    def close(self, timeout: float) -> None:
        """Nothing is buffered: every record was settled by its ``send``."""
