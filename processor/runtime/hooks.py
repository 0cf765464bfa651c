"""Fault points: named places in the loops where tests and benchmarks inject faults.

Passed to the loops explicitly, so a test never reaches into private methods. In production
nothing is registered and each point costs one dictionary lookup.
"""

from __future__ import annotations

from collections.abc import Callable


class Hooks:
    """Callbacks by point name, run in registration order when the loop passes that point.

    Points: ``before-commit`` and ``after-commit`` (worker, around a batch's COMMIT),
    ``after-produce`` (relay, acknowledged but rows not yet removed), ``relay-round`` and
    ``poller-step`` and ``retention-round`` (start of each round of those
    loops), ``worker-step`` (each poll), ``revoke`` (the consumer's revocation callback, also
    inside its close; processor and participant service), ``before-endpoint-close`` (processor
    shutdown, just before the metrics endpoint closes).
    """

    def __init__(self) -> None:
        self._at: dict[str, list[Callable[[], None]]] = {}

    def on(self, point: str, callback: Callable[[], None]) -> None:
        """Runs ``callback`` each time a loop passes ``point``; it may raise to inject a fault."""
        self._at.setdefault(point, []).append(callback)

    def fire(self, point: str) -> None:
        for callback in self._at.get(point, ()):
            callback()
