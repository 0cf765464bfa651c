"""Heartbeats of the processor's loops, so that a loop that hangs is seen as well as one that dies.

A loop blocked in a call that never returns (a database or broker call waiting on a peer that
vanished) keeps its thread alive: without a heartbeat it looks healthy forever while its work
stops. Each supervised loop calls :func:`beat` once per round; the supervisor reads the last
beat of each loop's thread (see :meth:`processor.runtime.supervisor.Supervisor.alive`).

Keyed by thread: one process may run several processors (tests), whose loops share names.
"""

from __future__ import annotations

import threading
import time

__all__ = ["beat", "last_beat"]

_beats: dict[int, float] = {}


def beat() -> None:
    """Records that the calling loop's thread just made progress."""
    _beats[threading.get_ident()] = time.monotonic()


def last_beat(thread: threading.Thread) -> float | None:
    """time.monotonic() of ``thread``'s last beat; None if it never beat."""
    ident = thread.ident
    return None if ident is None else _beats.get(ident)
