"""A producer that remembers every record until the broker acknowledges it.

The event publisher's Kafka side: records are produced one at a time as callers publish, and a
flush names each one that was refused or not acknowledged in time, by topic and message id (never
by content), so that no failed record goes unnoticed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from confluent_kafka import KafkaError, KafkaException, Producer

from processor._kafka.producer import is_permanent

__all__ = ["FailedDelivery", "TrackedProducer"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FailedDelivery:
    """One record the broker did not acknowledge.

    Attributes:
        topic: The topic it was sent to.
        message_id: Its ``message-id`` header.
        reason: The client's error, as text (never the record's content).
        permanent: True when sending the same record again cannot succeed (too large, unknown
            topic, not authorized); False when it may (a timeout: it may even arrive late).
    """

    topic: str
    message_id: str
    reason: str
    permanent: bool


class TrackedProducer:
    """Produces records and reports, at each flush, those that failed since the last one.

    Safe to share between threads: a flush waits for the records produced before it began.

    Args:
        factory: Makes the producer; called again after a fatal error, which leaves a producer
            unusable for every later record, and after a flush that left records
            unacknowledged.
    """

    def __init__(self, factory: Callable[[], Producer]) -> None:
        self._factory = factory
        self._producer = factory()
        self._seq = 0
        # Records produced and not yet reported, by sequence number: (topic, message id).
        self._pending: dict[int, tuple[str, str]] = {}
        self._failures: list[tuple[int, FailedDelivery]] = []
        self._fatal = False
        # Guards the bookkeeping only, never a client call: delivery callbacks run inside
        # poll() and flush(), in whichever thread calls them.
        self._lock = threading.Lock()

    @property
    def producer(self) -> Producer:
        """The current confluent-kafka producer (replaced after a fatal error or a timeout)."""
        return self._producer

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: Mapping[str, str],
        message_id: str,
    ) -> None:
        """Queues one record; a refusal before it leaves is reported by the next flush."""
        with self._lock:
            self._seq += 1
            seq = self._seq
            self._pending[seq] = (topic, message_id)
        header_values: dict[str, str | bytes | None] = dict(headers)
        on_delivery = partial(self._delivered, seq)
        while True:
            try:
                self._producer.produce(
                    topic, key=key, value=value, headers=header_values, on_delivery=on_delivery
                )
                break
            except BufferError:
                # Local queue full: let deliveries drain, then go on with the same record.
                self._producer.poll(0.1)
            except KafkaException as e:
                # Refused before it left, e.g. larger than message.max.bytes.
                err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
                reason = str(err) if err is not None else str(e)
                permanent = err is not None and is_permanent(err)
                with self._lock:
                    self._pending.pop(seq, None)
                    self._failures.append(
                        (seq, FailedDelivery(topic, message_id, reason, permanent))
                    )
                    self._fatal = self._fatal or (err is not None and err.fatal())
                break
        # Serves the callbacks of earlier records, so that they are not all kept until a flush.
        self._producer.poll(0)

    def _delivered(self, seq: int, err: KafkaError | None, _msg: object) -> None:
        with self._lock:
            entry = self._pending.pop(seq, None)
            if entry is None or err is None:
                return
            topic, message_id = entry
            failure = FailedDelivery(topic, message_id, str(err), is_permanent(err))
            self._failures.append((seq, failure))
            self._fatal = self._fatal or err.fatal()

    def flush(self, timeout: float) -> list[FailedDelivery]:
        """Waits up to ``timeout`` seconds for every record; returns those that failed, in order.

        A record produced before the flush began and still unacknowledged at its end is
        reported as failed (not permanent) and forgotten: it may still arrive, under its
        message id, which consumers dedupe on.
        """
        with self._lock:
            began = self._seq
        self._producer.flush(timeout)
        with self._lock:
            failures, self._failures = self._failures, []
            late = [(seq, entry) for seq, entry in self._pending.items() if seq <= began]
            for seq, _entry in late:
                del self._pending[seq]
            fatal, self._fatal = self._fatal, False
        failures.extend(
            (seq, FailedDelivery(topic, mid, f"not acknowledged within {timeout:g} s", False))
            for seq, (topic, mid) in late
        )
        if fatal or late:
            # The old producer's records are reported above, failed or unacknowledged. One
            # that left records unacknowledged may hold a partition's queue for good
            # (confluentinc/librdkafka#5430): the records sent again go through a new one.
            cause = "a fatal error" if fatal else f"{len(late)} record(s) not acknowledged"
            log.warning("recreating the event producer after %s", cause)
            self._producer = self._factory()
        return [f for _, f in sorted(failures, key=lambda p: p[0])]
