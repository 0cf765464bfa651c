"""Whether a failure means the database or the broker is out of reach, in one line."""

from __future__ import annotations

from processor.kafka.errors import unreachable as broker_unreachable
from processor.postgres.errors import unreachable as database_unreachable

__all__ = ["unreachable"]


def unreachable(e: BaseException) -> str | None:
    """One line saying the database or the broker is out of reach; None for any other failure."""
    return database_unreachable(e) or broker_unreachable(e)
