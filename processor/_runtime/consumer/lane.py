"""A worker thread whose caller can stop waiting: database calls that may never return.

A database behind a black-holed network never answers and never errors: the socket stays open,
so a call on it blocks for as long as the operating system keeps the connection (hours). The
consumer thread must not block with it, or it stops polling Kafka and its partitions stall
until the group's poll interval (minutes) runs out. So the worker runs its database calls on a
lane, waits a bounded time, and on timeout abandons the lane (a daemon thread, left to finish or
die with its connection) and opens a fresh one.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

from processor._errors import Retryable

_T = TypeVar("_T")


class Stuck(Retryable):
    """A call did not return within its bound; the lane that ran it was abandoned."""


class Lane:
    """Runs submitted calls one at a time, in order, on one daemon thread."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._calls: queue.SimpleQueue[tuple[Callable[[], object], Future[object]] | None] = (
            queue.SimpleQueue()
        )
        # Daemon: an abandoned lane stuck on a dead socket must not keep the process alive.
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        # Started by the first call: a processor is built whole before it starts, and a lane
        # of one that never starts holds no thread.
        self._start = threading.Lock()

    def _run(self) -> None:
        while (job := self._calls.get()) is not None:
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # handed to the waiting caller, who decides
                future.set_exception(e)

    def submit(self, fn: Callable[[], _T]) -> Future[_T]:
        """Queues ``fn``; the returned future holds its result or exception."""
        future: Future[_T] = Future()
        self._calls.put((fn, future))  # type: ignore[arg-type]
        if not self._thread.is_alive() and self._thread.ident is None:
            with self._start:
                if self._thread.ident is None:
                    self._thread.start()
        return future

    def call(self, fn: Callable[[], _T], timeout: float) -> _T:
        """Runs ``fn`` on the lane and waits at most ``timeout`` seconds.

        Raises:
            Stuck: ``fn`` did not return in time (the caller should abandon this lane).
        """
        return wait(self.submit(fn), timeout, what=self._name)

    def close(self) -> None:
        """Stops the thread after the calls already queued; does not wait for it."""
        self._calls.put(None)


def wait(future: Future[_T], timeout: float, *, what: str) -> _T:
    """The future's result, or :class:`Stuck` when it is not done within ``timeout`` seconds."""
    try:
        return future.result(timeout)
    except FutureTimeout:
        raise Stuck(f"{what}: the database did not answer within {timeout:g} s") from None
