"""Heartbeats of the processor's loops, so that a loop that hangs is seen as well as one that dies.

A loop blocked in a call that never returns (a database or broker call waiting on a peer that
vanished) keeps its thread alive: without a heartbeat it looks healthy forever while its work
stops. Each supervised loop calls :func:`beat` once per round; the supervisor reads the last
beat of each loop's thread (see :meth:`processor._runtime.supervisor.Supervisor.alive`).

Keyed by thread: one process may run several processors (tests), whose loops share names.
"""

from __future__ import annotations

import threading
import time

__all__ = ["beat", "forget_beat", "last_beat"]

_beats: dict[int, float] = {}


def beat() -> None:
    """Records that the calling loop's thread just made progress."""
    _beats[threading.get_ident()] = time.monotonic()


def forget_beat(thread: threading.Thread | None = None) -> None:
    """Clears the beat of ``thread`` (default: the calling one) before a new loop runs on it.

    A thread id is reused once its thread ended, so a beat an ended thread left under that id
    must not count as the new loop's.
    """
    ident = threading.get_ident() if thread is None else thread.ident
    if ident is not None:
        _beats.pop(ident, None)


def last_beat(thread: threading.Thread) -> float | None:
    """time.monotonic() of ``thread``'s last beat; None if it never beat."""
    ident = thread.ident
    return None if ident is None else _beats.get(ident)
