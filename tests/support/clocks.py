"""Clocks the contract suites hand to both adapters of a port."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class Offset:
    """The real clock, moved forward on demand."""

    def __init__(self) -> None:
        self.ahead = timedelta()

    def now(self) -> datetime:
        return datetime.now(UTC) + self.ahead


def moved_back(column: str) -> str:
    """SQL for ``column`` moved back by the interval parameter ``%s``, for aging stored rows.

    Through UTC: a timestamptz minus an interval depends on the session's time zone, so it is not
    immutable, and Citus refuses a function that is not in an UPDATE of a column's own value.
    """
    return f"(({column} AT TIME ZONE 'UTC') - %s) AT TIME ZONE 'UTC'"
