"""What the processor keeps: of each record in the history, and of old rows at all."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from processor.settings._values import Duration

__all__ = [
    "HistorySettings",
    "RetentionSettings",
]


class HistorySettings(BaseModel):
    """What the saga history keeps of each record (``SAGA_HISTORY__*``)."""

    # full: headers and value as received; hashed: headers and the value's SHA-256 (no
    # personal data kept); off: neither. The commands and deadlines each step produced are
    # kept in every mode.
    payload: Literal["full", "hashed", "off"] = "full"


class RetentionSettings(BaseModel):
    """Built-in retention: which old rows the processor deletes, and when (`SAGA_RETENTION__*`).

    Ages count from when a saga ended, a message was applied or recorded, a record was
    dead-lettered or held, or an outbox row was set aside; the database's clock measures them.
    """

    enabled: bool = True
    # An ended saga's row and history are deleted this long after it ended; a tombstone stays.
    ended_sagas: Duration = timedelta(days=30)
    # History rows that applied nothing (duplicates, ignored, parked, stale deadlines).
    history: Duration = timedelta(days=30)
    # How long a message id (applied history rows) and an ended saga (its tombstone) are
    # remembered, so that a redelivered message or a late start event is recognised.
    dedupe_window: Duration = timedelta(days=90)
    # Dead letters are kept until an operator replays or purges them (the stored row is the
    # only full copy of a dead letter whose value was cut to fit the broker); a period deletes
    # them that long after they were recorded, handled or not.
    dead_letters: Duration | None = None
    # Held messages of sagas that are no longer parked (a parked saga's are kept until its retry).
    parked_messages: Duration = timedelta(days=30)
    # Failed and held outbox rows are commands nobody sent: kept until an operator retries or
    # discards them; a period deletes them (and the commands) that long after they were set aside.
    failed_outbox: Duration | None = None
    # Most rows (or ended sagas) one delete removes, each in its own short transaction.
    chunk_size: int = Field(default=1000, ge=1, le=100_000)
    # Time between rounds; a round deletes everything that is due, chunk by chunk.
    interval: Duration = timedelta(minutes=1)
    # Pause between two chunks of a round, so a backlog never monopolises the database.
    chunk_pause: Duration = timedelta(milliseconds=50)

    @model_validator(mode="after")
    def _window_covers_purges(self) -> RetentionSettings:
        if self.dedupe_window < max(self.ended_sagas, self.history):
            raise ValueError(
                f"retention.dedupe-window ({self.dedupe_window}) must be at least "
                f"retention.ended-sagas ({self.ended_sagas}) and retention.history "
                f"({self.history}): it is how long duplicates stay recognised"
            )
        if self.interval <= timedelta(0):
            raise ValueError("retention.interval must be positive")
        return self
