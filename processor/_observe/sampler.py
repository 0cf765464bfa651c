"""Samples the database-derived gauges on an interval, so that a scrape never queries.

One sampler per replica. A sample that fails (or hangs, the database being out of reach) leaves
the previous values in place and the time of the last good sample unchanged; the readiness
probe reads that time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from processor._observe.metrics import Metrics
from processor._ports.cluster import TP, DatabaseSample

__all__ = ["Sampler"]

log = logging.getLogger(__name__)


class Sampler:
    """Reads the database (and the partitions' high watermarks) every ``interval`` seconds.

    Args:
        sample: One reading of the database; raises when it cannot be taken.
        metrics: Receives each good sample.
        interval: Seconds between samples.
        high_watermarks: The broker's high watermark per partition, or None before the
            consumer exists.

    Attributes:
        last_ok: time.monotonic() of the last good sample; None before the first.
        latest: The last good sample.
        last_error: Why the last sample failed; None after a good one.
    """

    def __init__(
        self,
        sample: Callable[[], DatabaseSample],
        metrics: Metrics,
        interval: float,
        high_watermarks: Callable[[Sequence[TP]], dict[TP, int]] | None = None,
    ) -> None:
        self._sample = sample
        self._metrics = metrics
        self.interval = interval
        self.high_watermarks = high_watermarks
        self.last_ok: float | None = None
        self.latest: DatabaseSample | None = None
        self.last_error: str | None = None
        self.wake = threading.Event()

    def sample_once(self) -> bool:
        """Takes one sample; False (and the reason in ``last_error``) when it failed."""
        try:
            sample = self._sample()
        except Exception as e:
            if self.last_error is None:
                log.warning("could not sample the database for metrics: %s", e)
            self.last_error = f"{type(e).__name__}: {e}"[:300]
            return False
        marks: dict[TP, int] | None = {}
        watermarks = self.high_watermarks
        if watermarks is not None and sample.stored_offsets:
            try:
                marks = watermarks(sorted(sample.stored_offsets))
            except Exception as e:  # the broker away: lag stays as last seen
                log.debug("no high watermarks for the lag gauge: %s", e)
                marks = None
        self._metrics.sampled(sample, marks)
        self.latest = sample
        self.last_ok = time.monotonic()
        self.last_error = None
        return True

    def age(self) -> float | None:
        """Seconds since the last good sample; None before the first."""
        return None if self.last_ok is None else time.monotonic() - self.last_ok

    def run(self, stop: threading.Event) -> None:
        """Samples until ``stop`` is set."""
        while not stop.is_set():
            self.sample_once()
            # In short slices, so a shutdown does not wait out a whole interval.
            until = time.monotonic() + self.interval
            while not stop.is_set() and (left := until - time.monotonic()) > 0:
                if self.wake.wait(min(left, 0.25)):
                    break
            self.wake.clear()
