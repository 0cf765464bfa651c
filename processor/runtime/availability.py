"""How long the database has been failing this replica, and when to try it again."""

from __future__ import annotations

from collections.abc import Callable

# Waits between retries while the database fails: short at first, then at most this long.
MAX_BACKOFF = 5.0


class Availability:
    """Tracks one unbroken stretch of failures with a clock, and paces the retries."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._since: float | None = None
        self._backoff = 0.0
        self._retry_at = 0.0

    def failed(self, *, back_off: bool = False) -> None:
        """Notes a failure; with ``back_off`` the next try waits a little longer than the last."""
        now = self._clock()
        if self._since is None:
            self._since = now
        if back_off:
            self._backoff = min(MAX_BACKOFF, max(0.1, self._backoff * 2))
            self._retry_at = now + self._backoff

    def succeeded(self) -> None:
        """The database answered: the stretch of failures is over."""
        self._since = None
        self._backoff = 0.0
        self._retry_at = 0.0

    def may_try(self) -> bool:
        """Whether the backoff since the last failure has passed."""
        return self._clock() >= self._retry_at

    def down_for(self) -> float:
        """Seconds since the first failure of the current stretch; 0 when there is none."""
        return 0.0 if self._since is None else self._clock() - self._since
