"""Clocks the contract suites hand to both adapters of a port."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class Offset:
    """The real clock, moved forward on demand."""

    def __init__(self) -> None:
        self.ahead = timedelta()

    def now(self) -> datetime:
        return datetime.now(UTC) + self.ahead
