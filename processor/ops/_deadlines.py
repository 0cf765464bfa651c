"""Operator views of the deadline table: one saga's pending deadlines, and overdue ones.

An overdue deadline is normal for a moment (the poller fires it on its next wake-up); one that
stays overdue points at a poller that is down, cannot get the lease, or cannot reach Kafka.
"""

from __future__ import annotations

from datetime import datetime

from processor._ports import DeadlineRow, OperatorStore

__all__ = ["DeadlineRow", "overdue_deadlines", "pending_deadlines"]


def pending_deadlines(store: OperatorStore, saga_type: str, saga_id: str) -> list[DeadlineRow]:
    """Deadlines still scheduled for one saga instance, soonest first.

    Args:
        store: The processor's database, e.g. `processor._postgres.reads.operator.OperatorQueries`.
        saga_type: Saga type, e.g. ``"transfer-saga"``.
        saga_id: Saga instance id (its association value).
    """
    return store.pending_deadlines(saga_type, saga_id)


def overdue_deadlines(
    store: OperatorStore, now: datetime | None = None, limit: int = 100
) -> list[DeadlineRow]:
    """Deadlines due at or before ``now``, oldest due first.

    Args:
        store: The processor's database, e.g. `processor._postgres.reads.operator.OperatorQueries`.
        now: Reference instant; None uses the database clock, the one the poller uses.
        limit: Maximum number of rows returned.
    """
    return store.overdue_deadlines(now, limit)
