"""Watches the processor's loops: a loop that dies stops the whole process, loudly.

A process whose relay (or poller, or listener) thread died while the consumer goes on looks
alive to the platform but publishes nothing: every saga's commands stop. So the first loop that
ends with an exception, or returns while the process is still meant to run, is logged at ERROR
with its traceback and sets the shared stop event; :meth:`Processor.run` then shuts the rest
down and raises :class:`processor._errors.LoopDied`, and the command line exits non-zero so that
the platform starts a fresh process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from processor._runtime.heartbeat import forget_beat, last_beat

__all__ = ["LoopFailure", "Supervisor"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoopFailure:
    """Why one loop ended early.

    Attributes:
        loop: The loop's name (``relay``, ``relay-listener``, ``deadline-poller``, ``retention``,
            ``consumer``).
        error: The exception that ended it; None when the loop returned without being stopped.
    """

    loop: str
    error: BaseException | None

    def describe(self) -> str:
        """One line naming the loop and the error's type (its text may be long; the log has it)."""
        if self.error is None:
            return f"loop {self.loop!r} ended while the processor was running"
        return f"loop {self.loop!r} died: {type(self.error).__name__}: {self.error}"[:500]


class Supervisor:
    """Runs loops on daemon threads and records the first one that dies.

    Args:
        stop: The event every loop watches; set when any loop dies, so the others wind down.

    Attributes:
        failed: Set once a loop has died; the consumer loop checks it between polls.
    """

    def __init__(self, stop: threading.Event, clock: Callable[[], float] = time.monotonic) -> None:
        self._stop = stop
        self.stop_event = stop
        self._clock = clock
        self.failed = threading.Event()
        self._failures: list[LoopFailure] = []
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        # Loops that beat (processor/_runtime/heartbeat.py): name -> (longest gap, started at).
        self._hang_after: dict[str, tuple[float, float]] = {}
        self._hung: set[str] = set()

    def spawn(
        self,
        name: str,
        target: Callable[[threading.Event], None],
        *,
        hang_after: float | None = None,
    ) -> threading.Thread:
        """Starts ``target(stop)`` on a daemon thread named ``name``, under supervision.

        Args:
            name: The loop's name, in logs and health.
            target: The loop; it returns once the stop event is set.
            hang_after: When set, the loop calls :func:`processor._runtime.heartbeat.beat` at
                least this often (seconds); a longer gap counts as hung in :meth:`alive`.
        """

        def supervised() -> None:
            try:
                target(self._stop)
            except BaseException as e:  # any end of a loop is reported, even SystemExit
                self.record(name, e)
                return
            if not self._stop.is_set():
                self.record(name, None)

        thread = threading.Thread(target=supervised, name=name, daemon=True)
        self._threads[name] = thread
        if hang_after is not None:
            self._hang_after[name] = (hang_after, self._clock())
        thread.start()
        # Its id may be one an ended thread used, and beat under: not this loop's beat.
        forget_beat(thread)
        return thread

    def record(self, loop: str, error: BaseException | None) -> None:
        """Logs a loop's death once, with its traceback, and stops every other loop."""
        failure = LoopFailure(loop, error)
        with self._lock:
            self._failures.append(failure)
        if error is None:
            log.error("%s; stopping the process", failure.describe())
        else:
            log.error(
                "loop %r died on %s; stopping the process so that it is restarted",
                loop,
                type(error).__name__,
                exc_info=error,
            )
        self.failed.set()
        self._stop.set()

    @property
    def failure(self) -> LoopFailure | None:
        """The first loop that died, if any."""
        with self._lock:
            return self._failures[0] if self._failures else None

    def alive(self) -> dict[str, bool]:
        """Each supervised loop by name: True while its thread runs and, if it beats, beats.

        A loop that has not beaten for longer than its ``hang_after`` is reported False (and
        logged once, with how long): its thread runs but its work has stopped, and only a
        restart of the process ends a call that never returns.
        """
        out = {}
        now = self._clock()
        for name, thread in self._threads.items():
            ok = thread.is_alive()
            limit = self._hang_after.get(name)
            if ok and limit is not None and not self._stop.is_set():
                gap, started = limit
                since = now - (last_beat(thread) or started)
                if since > gap:
                    ok = False
                    if name not in self._hung:
                        self._hung.add(name)
                        log.error(
                            "loop %r has made no progress for %.0f s (bound %.0f s): it is hung; "
                            "health reports it dead so that the process is restarted",
                            name,
                            since,
                            gap,
                        )
                else:
                    self._hung.discard(name)
            out[name] = ok
        return out

    def join_one(self, name: str, seconds: Callable[[], float]) -> None:
        """Waits up to ``seconds()`` for loop ``name`` to end (at once if it never ran)."""
        thread = self._threads.get(name)
        if thread is not None:
            thread.join(max(0.0, seconds()))

    def join(self, deadline: Callable[[], float]) -> list[str]:
        """Waits for every loop until ``deadline()`` seconds are left; returns those still alive."""
        for thread in self._threads.values():
            thread.join(max(0.0, deadline()))
        return [name for name, thread in self._threads.items() if thread.is_alive()]
