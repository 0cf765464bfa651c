"""Bounded, jittered retry delays that never run past the saga's remaining budget.

Jitter is derived from a key (saga id, step, attempt) instead of a random source: a handler must
be a pure function of its input, so replaying the same input has to pick the same delay, while
different sagas still spread out instead of retrying in lockstep.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from processor._errors import SagaDefinitionError

__all__ = ["NO_RETRY", "RetryPolicy", "jitter_fraction"]


def jitter_fraction(key: str) -> float:
    """Return a stable number in ``[0, 1)`` derived from ``key``."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and how far apart, to try again.

    The delay before attempt ``n + 1`` is ``base_delay * 2 ** (n - 1)`` capped at ``max_delay``,
    then shortened by up to ``jitter`` of itself.

    Attributes:
        max_attempts: Attempts in total, the first one included; 1 means never retry.
        base_delay: Delay after the first attempt, before jitter.
        max_delay: Upper bound of any delay.
        jitter: Fraction in ``[0, 1]`` of each delay that is randomised away.
    """

    max_attempts: int = 1
    base_delay: timedelta = timedelta(seconds=1)
    max_delay: timedelta = timedelta(minutes=1)
    jitter: float = 0.5

    def __post_init__(self) -> None:
        problems = []
        if self.max_attempts < 1:
            problems.append(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_delay <= timedelta(0):
            problems.append(f"base_delay must be positive, got {self.base_delay}")
        if self.max_delay < self.base_delay:
            problems.append(f"max_delay {self.max_delay} is below base_delay {self.base_delay}")
        if not 0.0 <= self.jitter <= 1.0:
            problems.append(f"jitter must be within [0, 1], got {self.jitter}")
        if problems:
            raise SagaDefinitionError(problems, subject="retry policy")

    def ceiling(self, attempt: int) -> timedelta:
        """The delay after ``attempt`` (1-based) before jitter."""
        # Compare as floats: base * 2 ** 60 seconds does not fit in a timedelta at all.
        doublings = min(max(attempt - 1, 0), 1000)
        grown = self.base_delay.total_seconds() * 2.0**doublings
        if grown >= self.max_delay.total_seconds():
            return self.max_delay
        return timedelta(seconds=grown)

    def delay(self, attempt: int, key: str) -> timedelta:
        """The jittered delay after ``attempt``; ``key`` makes the jitter stable per retry."""
        ceiling = self.ceiling(attempt)
        return ceiling * (1.0 - self.jitter * jitter_fraction(f"{key}#{attempt}"))

    def next_attempt_at(
        self,
        attempt: int,
        now: datetime,
        key: str,
        *,
        budget_end: datetime | None = None,
        min_budget: timedelta = timedelta(0),
    ) -> datetime | None:
        """When attempt ``attempt + 1`` should start, or None when it must not happen.

        Args:
            attempt: Attempts made so far (1-based).
            now: Current time.
            key: Stable key of this retry sequence (e.g. ``"saga-id:step"``).
            budget_end: The saga's deadline; no attempt starts with less than ``min_budget``
                left before it.
            min_budget: The least time a started attempt needs to be useful.

        Returns:
            The start time, or None when the attempts are exhausted or the budget is too short.
        """
        if attempt >= self.max_attempts:
            return None
        at = now + self.delay(attempt, key)
        if budget_end is not None and at + min_budget > budget_end:
            return None
        return at


NO_RETRY = RetryPolicy()
"""One attempt, no retry."""
