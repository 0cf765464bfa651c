"""The worker's two batch-store handles, each used from its own lane, with bounded waits.

One handle commits batch N on the write lane while the other serves rebalance claims, planning
reads and resyncs on the control lane. A call that does not return within the bound abandons its
lane (and, given a factory, its handle) and counts as a database failure since it began.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from processor._ports import BatchStore
from processor._runtime.consumer.availability import Availability
from processor._runtime.consumer.batch import Limits
from processor._runtime.consumer.lane import Lane, Stuck

_T = TypeVar("_T")


class StoreLanes:
    """The batch store and the control store, their lanes, and the database's availability.

    Args:
        store: The handle batches are written and committed on (the write lane).
        control: The handle for claims, loads and offset reads (the control lane).
        store_factory: Opens a fresh handle to replace one abandoned with its lane; without it
            the old handle is kept.
        limits: Shared bounds; ``unavailable_timeout`` bounds each call.
        clock: The worker's clock.

    Attributes:
        availability: How long the database has been failing this replica.
    """

    def __init__(
        self,
        store: BatchStore,
        control: BatchStore,
        *,
        store_factory: Callable[[], BatchStore] | None,
        limits: Limits,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.control = control
        self.availability = Availability(clock)
        self._store_factory = store_factory
        self._limits = limits
        self._clock = clock
        self._write_lane = Lane("batch-writer")
        self._control_lane = Lane("batch-control")

    def on_control(self, fn: Callable[[], _T], what: str) -> _T:
        """Runs ``fn`` on the control lane, waiting at most the bound."""
        return self._call(self._control_lane, fn, what)

    def on_write(self, fn: Callable[[], _T], what: str) -> _T:
        """Runs ``fn`` on the write lane, waiting at most the bound."""
        return self._call(self._write_lane, fn, what)

    def submit_write(self, fn: Callable[[], None]) -> Future[None]:
        """Queues ``fn`` on the write lane; the caller waits for it (or not) later."""
        return self._write_lane.submit(fn)

    def _call(self, lane: Lane, fn: Callable[[], _T], what: str) -> _T:
        started = self._clock()
        try:
            return lane.call(fn, self._limits.unavailable_timeout)
        except Stuck:
            # Hung since it began: that is when the outage began (the caller notes it too).
            self.availability.failed(since=started)
            if lane is self._control_lane:
                self.abandon_control()
            else:
                self.abandon_write()
            raise

    def abandon_control(self) -> None:
        self._control_lane.close()
        self._control_lane = Lane("batch-control")
        if self._store_factory is not None:
            self.control = self._store_factory()

    def abandon_write(self) -> None:
        # The stuck call keeps its connection; the server ends that session (its idle timeout)
        # and releases its locks, so the partitions' next owner is not blocked for long.
        self._write_lane.close()
        self._write_lane = Lane("batch-writer")
        if self._store_factory is not None:
            self.store = self._store_factory()

    def close(self) -> None:
        """Stops both lanes after the calls already queued."""
        self._write_lane.close()
        self._control_lane.close()
