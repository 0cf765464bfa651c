"""Built-in retention: the processor deletes its own old rows, a little at a time.

Every ``interval`` a round deletes, kind by kind (:class:`processor._ports.Purge`), every row past
its retention period, in chunks of ``chunk_size`` rows, each chunk its own short transaction with
a pause between chunks, so that a backlog (retention just switched on over a year of history)
drains without long locks or a latency spike in the consumer's batches. One replica's round runs
at a time: a chunk that finds another replica's chunk under way ends this round early.

Duplicate detection survives the purge. An ended saga's history is deleted a chunk of rows at a
time (a saga with 100,000 history rows never becomes one statement), then its row is replaced by a
tombstone (saga type, saga id, ended at) kept for the dedupe window, which the planner reads as
an ended saga: a late or redelivered start event is recorded as ``ignored-ended`` and never
starts a second saga. The history of a saga still running (active or parked) is never deleted:
its applied rows are its message-id detector, the rest its audit trail. Dead letters and failed
outbox rows are work nobody handled yet: they stay until an operator replays, retries, discards
or purges them, unless a period is set for them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from datetime import timedelta

from processor._errors import Retryable
from processor._ports import Purge, RetentionStore
from processor._runtime.heartbeat import beat
from processor._runtime.hooks import HookPoint, Hooks
from processor.settings import RetentionSettings

__all__ = ["Retention", "periods"]

log = logging.getLogger(__name__)

# Longest single wait between rounds, so that a stop is noticed promptly.
_SLICE = 0.25


def periods(settings: RetentionSettings) -> list[tuple[Purge, timedelta]]:
    """Each kind of row with its retention period, in the order a round deletes them.

    Ended sagas come first: their history in chunks of rows, then their rows; tombstones after
    them, so a tombstone written this round is measured like the rest. Dead letters and failed
    outbox rows are unhandled work: left out unless the operator set a period for them.
    """
    out = [
        (Purge.ENDED_HISTORY, settings.ended_sagas),
        (Purge.ENDED_SAGAS, settings.ended_sagas),
        (Purge.HISTORY, settings.history),
        (Purge.APPLIED, settings.dedupe_window),
        (Purge.TOMBSTONES, settings.dedupe_window),
        (Purge.DEAD_LETTERS, settings.dead_letters),
        (Purge.PARKED, settings.parked_messages),
        (Purge.FAILED_OUTBOX, settings.failed_outbox),
    ]
    return [(what, period) for what, period in out if period is not None]


class Retention:
    """``round()`` deletes what is due; ``run()`` repeats it every interval until stopped.

    Args:
        store: The chunked deletes.
        settings: Periods, chunk size, interval, pause between chunks.
        hooks: Fault points; ``retention-round`` fires at the start of each round.

    Attributes:
        deleted: Rows (for ended sagas: sagas) deleted so far, by kind.
        rounds: Rounds completed so far (whether or not they deleted anything).
        wake: Set it to start the next round now instead of after the interval.
    """

    def __init__(
        self, store: RetentionStore, settings: RetentionSettings, *, hooks: Hooks | None = None
    ) -> None:
        self.store = store
        self.settings = settings
        self.hooks = hooks or Hooks()
        self.deleted: Counter[Purge] = Counter()
        self.rounds = 0
        self.wake = threading.Event()
        self._periods = periods(settings)

    def round(self, stop: threading.Event | None = None) -> Counter[Purge] | None:
        """Deletes every row past its period, chunk by chunk.

        Args:
            stop: Ends the round between two chunks when set.

        Returns:
            What this round deleted, by kind; None when another replica's round held the lock
            (what was deleted before that is still counted in :attr:`deleted`).
        """
        self.hooks.fire(HookPoint.RETENTION_ROUND)
        stop = stop or threading.Event()
        limit = self.settings.chunk_size
        pause = self.settings.chunk_pause.total_seconds()
        done: Counter[Purge] = Counter()
        kinds = [what for what, _ in self._periods]
        i = 0
        while i < len(self._periods) and not stop.is_set():
            what, period = self._periods[i]
            beat()
            n = self.store.purge(what, period, limit)
            if n is None:
                self._report(done, busy=True)
                return None
            done[what] += n
            self.deleted[what] += n
            if n < limit:
                i += 1
                continue
            stop.wait(pause)
            if what is Purge.ENDED_SAGAS:
                # More ended sagas are due: their history goes first, chunk by chunk.
                i = kinds.index(Purge.ENDED_HISTORY)
        self.rounds += 1
        self._report(done, busy=False)
        return done

    def run(self, stop: threading.Event) -> None:
        """Runs a round every interval until ``stop`` is set.

        A store that is unreachable (or a lock not granted in time) is tried again next round;
        any other failure ends the loop, and the supervisor stops the process.
        """
        interval = self.settings.interval.total_seconds()
        while not stop.is_set():
            ends = time.monotonic() + interval
            # In short slices: a stop must end the wait promptly, and `wake` may end it sooner.
            while not stop.is_set() and not self.wake.is_set():
                beat()
                left = ends - time.monotonic()
                if left <= 0:
                    break
                self.wake.wait(min(left, _SLICE))
            self.wake.clear()
            if stop.is_set():
                break
            try:
                self.round(stop)
            except Retryable as e:
                log.warning("retention round failed (%s); trying again next round", e)
        self.store.close()

    def _report(self, done: Counter[Purge], *, busy: bool) -> None:
        if not done:
            return
        what = ", ".join(f"{n} {kind}" for kind, n in done.items() if n)
        if what:
            suffix = " (stopped: another replica's retention is running)" if busy else ""
            log.info("retention deleted %s%s", what, suffix)
