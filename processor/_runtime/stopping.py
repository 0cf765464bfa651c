"""Ends a service process within its shutdown budget, whatever its client libraries do.

A graceful stop (finish the batch in hand, let the relay publish what was committed, leave the
consumer group) runs in Python, and one native call can stop every Python thread: inside a
consumer close, librdkafka calls the revocation back into Python, and confluent-kafka then waits
for librdkafka's own thread *while holding the interpreter lock*. With the broker gone that wait
may never end, and then neither a timer thread nor a signal handler ever runs again.

So the bound has two layers, both armed when the stop begins:

1. at the budget, a timer thread logs one line and exits with :data:`EXIT_OVERRAN`; this is the
   usual case, where Python still runs;
2. at the budget plus :data:`MARGIN`, faulthandler's watchdog (a native thread that needs no
   interpreter lock) writes every thread's stack to stderr and exits with :data:`EXIT_STUCK`.

Leaving early loses nothing: positions are stored in PostgreSQL in the transaction of the
effects they cover, so whoever owns a partition next resumes after the last committed batch;
a batch that did not commit is read and applied again by the next owner, once; committed outbox
rows stay until the broker acknowledges them, and the next relay sends them.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

__all__ = [
    "CONSUMER_CLOSE",
    "EXIT_OVERRAN",
    "EXIT_STUCK",
    "MARGIN",
    "ShutdownBound",
    "close_within",
    "exit_now",
    "on_stop_signals",
]

log = logging.getLogger(__name__)

EXIT_OVERRAN = 3
"""Exit code when the shutdown overran its budget, or a second SIGTERM/SIGINT came."""
EXIT_STUCK = 1
"""Exit code (faulthandler's) when no Python thread could run at the end of budget + margin."""
MARGIN = 5.0
"""Seconds past the budget before the native watchdog ends a process Python cannot end."""
CONSUMER_CLOSE = "consumer-close"
"""The name of the thread a consumer's close runs on at a stop (tests wait for those left)."""


def exit_now(code: int) -> NoReturn:
    """Flushes the logs and ends the process at once, without the interpreter's finalisation.

    Finalisation waits for the interpreter lock, which a thread stuck in a client library may
    hold for ever; everything worth keeping is in PostgreSQL already.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        # A closed or broken pipe: nothing more can be said.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def close_within(name: str, close: Callable[[], None], seconds: float) -> bool:
    """Runs ``close`` on a daemon thread named ``name`` for up to ``seconds``; True if it ended.

    A client's close can wait for ever on a broker that is gone or mid-rebalance; past the
    deadline it is left running, and the caller goes on with the rest of its stop.
    """
    done = threading.Event()

    def run() -> None:
        try:
            close()
        except Exception:
            log.warning("%s failed", name, exc_info=True)
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    return done.wait(max(0.0, seconds))


class ShutdownBound:
    """The process-wide deadline of a stop; :meth:`arm` starts it (once).

    Args:
        budget: Seconds the graceful stop may take (``SAGA_SHUTDOWN_TIMEOUT``).
        margin: Seconds past the budget before the native watchdog acts.
    """

    def __init__(self, budget: float, margin: float = MARGIN) -> None:
        self.budget = budget
        self.margin = margin
        self._armed = threading.Event()
        self._lock = threading.Lock()

    @property
    def armed(self) -> bool:
        """Whether a stop has begun."""
        return self._armed.is_set()

    def arm(self) -> None:
        """Starts both layers of the bound; later calls do nothing."""
        with self._lock:
            if self._armed.is_set():
                return
            self._armed.set()
        faulthandler.dump_traceback_later(self.budget + self.margin, exit=True, file=sys.stderr)
        timer = threading.Timer(self.budget, self._overran)
        timer.name = "shutdown-bound"
        timer.daemon = True
        timer.start()

    def watch(self, stopping: threading.Event) -> None:
        """Arms the bound once ``stopping`` is set, by a signal or by a loop that died."""

        def wait() -> None:
            stopping.wait()
            self.arm()

        threading.Thread(target=wait, name="shutdown-watch", daemon=True).start()

    def _overran(self) -> None:
        log.warning("shutdown overran its budget of %.0f s; exiting now", self.budget)
        exit_now(EXIT_OVERRAN)


def on_stop_signals(stop: Callable[[], None], bound: ShutdownBound) -> None:
    """SIGTERM or SIGINT asks ``stop`` and arms ``bound``; a second one ends the process at once.

    Must be called from the main thread (Python delivers signals there).
    """

    def again(signum: int, _frame: FrameType | None) -> None:
        log.warning("signal %d again: exiting now", signum)
        exit_now(EXIT_OVERRAN)

    def first(signum: int, _frame: FrameType | None) -> None:
        log.info(
            "signal %d: finishing the work in hand, then stopping (within %.0f s)",
            signum,
            bound.budget,
        )
        signal.signal(signal.SIGTERM, again)
        signal.signal(signal.SIGINT, again)
        bound.arm()
        stop()

    signal.signal(signal.SIGTERM, first)
    signal.signal(signal.SIGINT, first)
