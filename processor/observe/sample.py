"""What one sample of the database says, for the gauges and the readiness probe."""

from __future__ import annotations

from dataclasses import dataclass, field

TP = tuple[str, int]

AGE_BUCKETS = (60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0, 259200.0, 604800.0)
"""Upper bounds, in seconds, of the buckets of ``saga_state_age_seconds``: 1 min to 7 days."""


@dataclass(frozen=True, slots=True)
class DatabaseSample:
    """One reading of the processor's tables.

    Attributes:
        outbox_depth: Rows waiting in the outbox.
        outbox_oldest_age: Seconds since the oldest outbox row was written; 0 when empty.
        deadlines_pending: Deadlines scheduled and not dispatched.
        deadlines_overdue: Deadlines due and not dispatched.
        instances: Saga instances by (saga type, status).
        machine_states: Sagas not ended by (saga type, machine state): (count, oldest age).
        state_ages: For the same keys, how many have been in that state at most each of
            :data:`AGE_BUCKETS` (cumulative), and the sum of their ages in seconds.
        stored_offsets: Next offset stored for each partition this replica owns.
        schema_version: The schema version the database is migrated to.
    """

    outbox_depth: int = 0
    outbox_oldest_age: float = 0.0
    deadlines_pending: int = 0
    deadlines_overdue: int = 0
    instances: dict[tuple[str, str], int] = field(default_factory=dict)
    machine_states: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    state_ages: dict[tuple[str, str], tuple[tuple[int, ...], float]] = field(default_factory=dict)
    stored_offsets: dict[TP, int | None] = field(default_factory=dict)
    schema_version: int = 0
