"""A warning that a retry loop repeats while something stays down: said once, then summarised.

A loop that retries every second during a database outage would otherwise write a warning a
second per loop; the first one says what failed, later ones come at most once per ``every``
seconds with how many were held back, and the first success after them says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["RepeatedWarning"]


class RepeatedWarning:
    """Rate-limits one retry loop's failure warning (not thread-safe: one loop owns it).

    Args:
        logger: Where the lines go.
        what: What is failing, for the recovery line (``"deadline poller"``).
        every: Seconds between two warnings while the failure lasts.
        clock: Monotonic seconds; the tests pass their own.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        every: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._what = what
        self._every = every
        self._clock = clock
        self._first: float | None = None
        self._last = 0.0
        self._held = 0
        self._count = 0

    def failed(self, message: str, *args: object) -> None:
        """Logs ``message % args`` unless one was logged less than ``every`` seconds ago."""
        now = self._clock()
        self._count += 1
        if self._first is None:
            self._first = now
        elif now - self._last < self._every:
            self._held += 1
            return
        if self._held:
            message += " (%d more like it since %.0f s ago)"
            args = (*args, self._held, now - self._last)
        self._log.warning(message, *args)
        self._last = now
        self._held = 0

    def succeeded(self) -> None:
        """Ends a run of failures, saying how long it lasted and how many there were."""
        if self._first is None:
            return
        self._log.warning(
            "%s recovered after %d failure(s) over %.0f s",
            self._what,
            self._count,
            self._clock() - self._first,
        )
        self._first = None
        self._held = 0
        self._count = 0
