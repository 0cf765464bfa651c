"""Publishes outbox rows to Kafka, in order per saga, at least once.

A round: claim up to batch-size committed rows in id order (one relay at a time across replicas,
so a saga's row n+1 can never overtake row n in another process), send them, wait for every
acknowledgement, then let the claim commit. Any failure rolls the claim back and the rows are
sent again later under the same message ids.

The relay speaks only to the ports: :class:`processor.ports.OutboxStore` and
:class:`processor.ports.RecordProducer`. What to do about a failure is decided from its class.
"""

from __future__ import annotations

import logging
import threading

from processor.errors import DeliveryFailed, Retryable
from processor.ports import OutboxStore, RecordProducer
from processor.runtime.hooks import Hooks

__all__ = ["Relay"]

log = logging.getLogger(__name__)


class Relay:
    """The outbox relay: :meth:`run_once` publishes one round; :meth:`run` loops until stopped.

    Args:
        outbox: Where committed outbox rows are claimed.
        producer: Sends records and reports the ones not acknowledged.
        batch_size: Most rows claimed in one round.
        poll_interval: Seconds to wait for a wake-up when a round found less than a full batch.
        flush_timeout: Seconds to wait for a round's acknowledgements.
        hooks: Fault points: ``relay-round`` at the start of each round, ``after-produce`` once
            every record of a round was acknowledged but before its rows are removed.

    Attributes:
        wake: Set it to start the next round at once (a commit wrote outbox rows).
        published: Rows published and removed since start.
    """

    def __init__(
        self,
        outbox: OutboxStore,
        producer: RecordProducer,
        *,
        batch_size: int = 1000,
        poll_interval: float = 1.0,
        flush_timeout: float = 60.0,
        hooks: Hooks | None = None,
    ) -> None:
        self._outbox = outbox
        self._producer = producer
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.flush_timeout = flush_timeout
        self._hooks = hooks if hooks is not None else Hooks()
        self.wake = threading.Event()
        self.published = 0

    def run_once(self) -> int:
        """Publishes up to batch-size rows.

        Returns:
            The rows published; 0 when the outbox was empty or another relay holds the lock.

        Raises:
            DeliveryFailed: Some records were not acknowledged; every row of the round stays.
            Retryable: The store or the producer failed; every row of the round stays.
        """
        self._hooks.fire("relay-round")
        with self._outbox.claim(self.batch_size) as entries:
            if not entries:
                return 0
            failures = self._producer.send([e.row for e in entries], self.flush_timeout)
            if failures:
                # Raised inside the claim, so that the whole round rolls back: publishing only
                # the acknowledged rows would let a later row of a saga overtake a failed one.
                raise DeliveryFailed(failures)
            self._hooks.fire("after-produce")
        self.published += len(entries)
        return len(entries)

    def run(self, stop: threading.Event) -> None:
        """Publishes rounds until ``stop`` is set.

        Transient failures back off and try again; any other failure ends the loop (and its
        thread) with the exception.
        """
        failures = 0
        while not stop.is_set():
            try:
                n = self.run_once()
                failures = 0
            except (Retryable, DeliveryFailed) as e:
                failures += 1
                log.warning("relay round failed (%s); rows stay in the outbox", e)
                stop.wait(min(5.0, 0.2 * 2 ** min(failures, 5)))
                continue
            if n < self.batch_size:
                self.wake.wait(self.poll_interval)
                self.wake.clear()
        self._producer.close(5.0)

    def close(self) -> None:
        """Releases the store's connection."""
        self._outbox.close()
