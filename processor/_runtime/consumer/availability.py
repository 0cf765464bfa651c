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

    def failed(self, *, back_off: bool = False, since: float | None = None) -> None:
        """Notes a failure; with ``back_off`` the next try waits a little longer than the last.

        Args:
            back_off: Space the next try further from this one.
            since: When the failing call began, if earlier than now: a call that hung until
                its bound failed when it began, not when the wait for it gave up (counting from
                then doubled the time partitions stayed with a replica cut off mid-commit).
        """
        now = self._clock()
        start = now if since is None else min(since, now)
        if self._since is None or start < self._since:
            self._since = start
        if back_off:
            self._backoff = min(MAX_BACKOFF, max(0.1, self._backoff * 2))
            self._retry_at = now + self._backoff

    def succeeded(self) -> None:
        """The database answered: the stretch of failures is over."""
        self._since = None
        self._backoff = 0.0
        self._retry_at = 0.0

    @property
    def retry_at(self) -> float:
        """When the next try may be made (the clock's time)."""
        return self._retry_at

    def may_try(self) -> bool:
        """Whether the backoff since the last failure has passed."""
        return self._clock() >= self._retry_at

    def down_for(self) -> float:
        """Seconds since the first failure of the current stretch; 0 when there is none."""
        return 0.0 if self._since is None else self._clock() - self._since
