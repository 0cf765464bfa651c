"""The single active deadline poller.

Leadership is a lease with a fencing token; every time comes from the store's clock (the
database's, in production). A sweep claims due deadlines in the same statement that checks the
lease (holder, token, expiry), commits the claim, then sends one deadline-fired record per
deadline to the saga's own input partition, so a timeout and a reply for one saga are decided in
log order by the consumer. The consumer applies a fired record only if its token is both the
row's dispatch token and the current lease token: a paused ex-leader's late records are no-ops.

A fired record is sent again only when it can no longer apply: a new leader (new token) fires
again every row an earlier token dispatched, and a consumer that meets a record of an outdated
token while its row still waits under that token makes the row due again. There is no timer
that consumer lag could outrun, and a parked saga's deadlines are not fired until its retry.

Precision does not depend on the polling interval: the poller sleeps until the next due time and
is woken whenever a batch commits new deadlines.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from processor._engine.records import OutboxRow
from processor._errors import Retryable
from processor._observe.repeats import RepeatedWarning
from processor._ports import DeadlineRow, DeadlineStore, RecordProducer
from processor._runtime.heartbeat import beat
from processor._runtime.hooks import HookPoint, Hooks
from processor.settings import DeadlineSettings

__all__ = ["DeadlinePoller"]

log = logging.getLogger(__name__)

# The most rows one sweep claims while a backlog drains (see DeadlinePoller._limit).
BURST_LIMIT = 3200

# How long to wait for the broker to acknowledge a sweep's fired records.
SEND_TIMEOUT = 30.0
# Pause before the next step after the store or the broker failed.
RETRY_PAUSE = 1.0


class DeadlinePoller:
    """``step()`` runs one lease-and-sweep; ``run()`` loops it with precise sleeps.

    Args:
        store: The lease and the deadline rows.
        producer: Sends the fired records.
        holder: This replica's name in the lease.
        settings: Polling interval, batch size, lease TTL (``redispatch_after`` is ignored).
        hooks: Fault points; ``poller-step`` fires at the start of each step.
        monotonic: Local elapsed-time clock, for what the poller remembers between steps
            (when the next row is due); tests pass a fake one.
        route: (topic, key, stored partition) -> the partition the saga's input goes to now:
            after a topic grew, a moved saga's deadline fires where its events arrive
            (_runtime/growth.py). None: the stored partition.
        on_fired: Called with the fire lag (seconds from due to acknowledged) of each sweep's
            records (the metrics).

    Attributes:
        wake: Set it to end the current sleep (a batch in this process committed deadlines).
        fired: How many fired records were acknowledged so far.
        token: The lease's fencing token while this poller holds it, else None.
    """

    def __init__(
        self,
        store: DeadlineStore,
        producer: RecordProducer,
        *,
        holder: str,
        settings: DeadlineSettings,
        hooks: Hooks | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        route: Callable[[str, bytes, int], int] | None = None,
        on_fired: Callable[[list[float]], None] | None = None,
    ) -> None:
        self.store = store
        self.producer = producer
        self.holder = holder
        self.settings = settings
        self.hooks = hooks or Hooks()
        self._monotonic = monotonic
        self.token: int | None = None
        self.fired = 0
        self.on_fired = on_fired
        self.wake = threading.Event()
        self.route = route
        self._ttl = settings.lease_ttl.total_seconds()
        # Each sweep claims `polling.batch-size` rows; while sweeps come back full (a burst came
        # due) the limit doubles, up to BURST_LIMIT, so a backlog costs few round trips and
        # flushes; the first sweep that is not full returns to the configured size.
        self._batch = settings.polling.batch_size
        self._limit = self._batch
        self._more = False
        # The next claim takes stale rows too: set when the token changes (rows an earlier
        # leader dispatched may never have reached Kafka).
        self._full_sweep = True
        # The token last held, kept through a lost connection: renewing needs it.
        self._held: int | None = None
        # (monotonic time, seconds until the next due row) as the last short sweep saw it.
        self._due: tuple[float, float | None] | None = None
        self._unsent = False

    # -- one step --------------------------------------------------------------------------

    def acquire(self) -> int | None:
        """Takes or renews the lease; None when another holder's lease is still valid."""
        token = self.store.acquire(self.holder, self._ttl, self._held)
        self._held = token
        if token != self.token:
            self._full_sweep = True
            if token is None:
                log.info("deadline lease lost by %s (token %s)", self.holder, self.token)
            else:
                log.info("deadline lease won by %s (token %d)", self.holder, token)
        self.token = token
        return token

    def sweep(self, token: int) -> int:
        """Claims up to batch-size due deadlines and sends their fired records.

        Returns:
            How many deadlines were claimed (acknowledged or not).
        """
        limit = self._limit
        rows, due = self.store.claim_due(self.holder, token, limit, full=self._full_sweep)
        self._more = len(rows) >= limit
        if self._more:
            self._limit = min(2 * limit, max(BURST_LIMIT, self._batch))
        else:
            self._limit = self._batch
            self._full_sweep = False
            self._due = (self._monotonic(), due)
        if not rows:
            return 0
        try:
            fired = [_fired(d, token, self.route) for d in rows]
            failures = self.producer.send(fired, SEND_TIMEOUT)
        except Retryable:
            # None is known to be acknowledged: due again.
            self.store.unclaim([d.id for d in rows], token)
            self._unsent = True
            raise
        if failures:
            log.warning(
                "%d deadline-fired records not acknowledged; they are retried", len(failures)
            )
            self.store.unclaim([rows[f.index].id for f in failures], token)
            # Due again at once: the next step retries them rather than waiting for a wake-up.
            self._unsent = True
        self.fired += len(rows) - len(failures)
        if self.on_fired is not None:
            # The local clock against the database's due time: close enough for a histogram
            # whose buckets start at tens of milliseconds.
            now = datetime.now(UTC)
            unsent = {f.index for f in failures}
            lags = [(now - d.due_at).total_seconds() for i, d in enumerate(rows) if i not in unsent]
            self.on_fired([max(0.0, lag) for lag in lags])
        return len(rows)

    def seconds_until_next(self, token: int) -> float | None:
        """Seconds until a deadline comes due; None when none is pending."""
        if self._unsent:
            self._unsent = False
            return 0.0
        now = self._monotonic()
        if self._due is None:
            self._due = (now, self.store.next_due_in())
        seen_at, due = self._due
        self._due = None
        if due is not None:
            due -= now - seen_at
        return due

    def step(self) -> float:
        """Lease, sweep until drained; returns how long to sleep before the next step."""
        self.hooks.fire(HookPoint.POLLER_STEP)
        interval = self.settings.polling.interval.total_seconds()
        token = self.acquire()
        if token is None:
            return interval
        self.sweep(token)
        while self._more:
            self.sweep(token)
        nxt = self.seconds_until_next(token)
        return interval if nxt is None else max(0.0, min(interval, nxt))

    # -- loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Steps and sleeps until ``stop`` is set; then flushes the producer, closes the store.

        A ``Retryable`` failure drops the lease token (the store reconnects on its next call);
        every other failure propagates.
        """
        failures = RepeatedWarning(log, "deadline poller")
        try:
            while not stop.is_set():
                beat()
                try:
                    wait = self.step()
                    failures.succeeded()
                    # Wakes early on a commit of deadlines in any process.
                    self.store.wait(wait, stop, self.wake)
                    self.wake.clear()
                except Retryable as e:
                    failures.failed("deadline poller retrying after: %s", e)
                    self.token = None
                    stop.wait(RETRY_PAUSE)
        finally:
            self.producer.close(5.0)
            self.store.close()


def _fired(
    due: DeadlineRow, token: int, route: Callable[[str, bytes, int], int] | None = None
) -> OutboxRow:
    """The record that fires ``due``, for the saga's own input partition (where it is now)."""
    record = due.fired(token)
    key = record.key()
    return OutboxRow(
        saga_type=due.saga_type,
        saga_id=due.saga_id,
        topic=due.topic,
        key=key,
        headers=record.headers(due.traceparent, due.tracestate),
        value=record.value(),
        partition=due.partition if route is None else route(due.topic, key, due.partition),
    )
