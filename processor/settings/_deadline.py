"""The deadline poller's settings (`SAGA_DEADLINE__*`), named as in the deadline specification."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field, field_validator, model_validator

from processor.settings._values import Duration, check_identifier

__all__ = [
    "DeadlinePollingSettings",
    "DeadlineSchemaSettings",
    "DeadlineSettings",
]


class DeadlinePollingSettings(BaseModel):
    """How often the deadline poller sweeps for due deadlines, and how many per sweep."""

    interval: Duration = timedelta(seconds=30)
    batch_size: int = Field(default=100, ge=1)


class DeadlineSchemaSettings(BaseModel):
    """Whether the deadline tables are created on startup."""

    auto: bool = True


class DeadlineSettings(BaseModel):
    """The deadline poller: its lease, its sweeps and its tables (`SAGA_DEADLINE__*`)."""

    enabled: bool = True
    polling: DeadlinePollingSettings = Field(default_factory=DeadlinePollingSettings)
    lease_ttl: Duration = timedelta(minutes=2)
    schema_: DeadlineSchemaSettings = Field(default_factory=DeadlineSchemaSettings, alias="schema")
    table: str = "saga_deadline"
    lock_table: str = "saga_deadline_lock"
    # Deprecated, no effect: a fired record is sent again only when it was consumed without
    # effect (its token outdated) or under a new lease, never on a timer that lag can outrun.
    # Still accepted so that existing configurations load.
    redispatch_after: Duration = timedelta(seconds=30)

    model_config = {"populate_by_name": True}

    _check_tables = field_validator("table", "lock_table")(
        classmethod(lambda cls, v: check_identifier(v))
    )

    @model_validator(mode="after")
    def _lease_outlives_interval(self) -> DeadlineSettings:
        if self.lease_ttl <= self.polling.interval:
            raise ValueError(
                f"deadline.lease-ttl ({self.lease_ttl}) must exceed deadline.polling.interval "
                f"({self.polling.interval}): the leader renews its lease once per sweep"
            )
        return self
