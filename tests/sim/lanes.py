"""The worker's database lanes in the simulated world: calls run when the schedule says.

In production a lane is a thread (``processor._runtime.consumer.lane``): the consumer thread
plans batch N+1 while batch N commits on the write lane, and abandons a lane whose call hangs.
Here the control lane runs each call at once, and the write lane keeps each submitted batch
until the scheduler commits it or the worker waits for it, whichever comes first; a commit the
scheduler stalls makes the worker's wait time out (and the lane be abandoned) and may still go
through later, after the worker has given up on it, as a hung commit can.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from processor._runtime.consumer.lane import wait

__all__ = ["SimFuture", "SimLane"]

_T = TypeVar("_T")

WRITER = "batch-writer"


class SimFuture(Future[Any]):
    """A call that runs when first waited for, or when the scheduler runs it."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__()
        self._fn = fn
        self.stalled = False

    def run(self) -> None:
        if self.done() or not self.set_running_or_notify_cancel():
            return
        try:
            self.set_result(self._fn())
        except BaseException as e:  # handed to whoever waits, as on a lane's thread
            self.set_exception(e)

    def result(self, timeout: float | None = None) -> Any:
        if not self.done():
            if self.stalled:
                raise FutureTimeout()
            self.run()
        return super().result(0)


class SimLane:
    """Stands in for ``Lane``: the same calls, run by the schedule instead of a thread."""

    def __init__(self, name: str) -> None:
        self._name = name
        self.pending: list[SimFuture] = []

    def submit(self, fn: Callable[[], _T]) -> Future[_T]:
        future = SimFuture(fn)
        if self._name == WRITER:
            self.pending.append(future)
        else:
            future.run()
        return future

    def call(self, fn: Callable[[], _T], timeout: float) -> _T:
        return wait(self.submit(fn), timeout, what=self._name)

    def waiting(self) -> list[SimFuture]:
        """Submitted and not run yet (stalled ones included)."""
        self.pending = [f for f in self.pending if not f.done()]
        return self.pending

    def close(self) -> None:
        return None
