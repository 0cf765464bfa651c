"""Fault points: named places in the loops where tests and benchmarks inject faults.

Passed to the loops explicitly, so a test never reaches into private methods. In production
nothing is registered and each point costs one dictionary lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

__all__ = ["HookPoint", "Hooks"]


class HookPoint(StrEnum):
    """Every point a loop fires. A name outside this list is refused, not silently never run."""

    # Worker, around a batch: its plan is written, then COMMIT.
    BEFORE_WRITE = "before-write"
    BEFORE_COMMIT = "before-commit"
    AFTER_COMMIT = "after-commit"
    # The consumer's revocation callback, also inside its close (processor and participant).
    REVOKE = "revoke"
    # Relay: start of each round; records acknowledged by the broker, rows not yet removed.
    RELAY_ROUND = "relay-round"
    AFTER_PRODUCE = "after-produce"
    # Start of each round of the deadline poller and of retention.
    POLLER_STEP = "poller-step"
    RETENTION_ROUND = "retention-round"
    # Processor shutdown, just before the metrics endpoint closes.
    BEFORE_ENDPOINT_CLOSE = "before-endpoint-close"


def _unknown(point: str) -> ValueError:
    known = ", ".join(p.value for p in HookPoint)
    return ValueError(f"unknown hook point {point!r}; the points are: {known}")


class Hooks:
    """Callbacks by point, run in registration order when the loop passes that point.

    Points are :class:`HookPoint` members or their values (``"after-commit"``); any other name
    raises ``ValueError`` on :meth:`on` and on :meth:`fire`, so a misspelt point fails the test
    that registers it instead of never firing.
    """

    def __init__(self) -> None:
        # Every point has its (usually empty) list, so firing a valid point is one lookup and
        # a miss means the name is unknown.
        self._at: dict[str, list[Callable[[], None]]] = {p: [] for p in HookPoint}

    def on(self, point: HookPoint | str, callback: Callable[[], None]) -> None:
        """Runs ``callback`` each time a loop passes ``point``; it may raise to inject a fault.

        Raises:
            ValueError: ``point`` is not a :class:`HookPoint`.
        """
        callbacks = self._at.get(point)
        if callbacks is None:
            raise _unknown(point)
        callbacks.append(callback)

    def fire(self, point: HookPoint | str) -> None:
        """Runs the callbacks registered for ``point``.

        Raises:
            ValueError: ``point`` is not a :class:`HookPoint`.
        """
        callbacks = self._at.get(point)
        if callbacks is None:
            raise _unknown(point)
        for callback in callbacks:
            callback()
