"""Settings of what runs beside the consumer: the metrics endpoint, and participant services."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field, field_validator

from processor.settings._values import Duration, check_identifier

__all__ = [
    "MetricsSettings",
    "ParticipantSettings",
]


class MetricsSettings(BaseModel):
    """The HTTP endpoint for Prometheus and the probes (`SAGA_METRICS__*`; deploy/METRICS.md)."""

    # 0 disables the endpoint (and the sampler); tests may ask for a free port with `bind_any`.
    port: int = Field(default=9464, ge=0, le=65535)
    host: str = "0.0.0.0"
    # Pick a free port instead of `port` (tests: several processors in one machine).
    bind_any: bool = False
    # How often the database-derived gauges (outbox, deadlines, sagas, lag) are sampled.
    sample_interval: Duration = timedelta(seconds=15)
    # /healthz fails when the consumer loop has not stepped for this long; /readyz fails when
    # the last successful sample of the database is older than this.
    stale_after: Duration = timedelta(seconds=60)


class ParticipantSettings(BaseModel):
    """A participant service run by `saga-processor participant run` (`SAGA_PARTICIPANT__*`).

    Its Kafka client, database URL, consumer batch and timeouts, relay, metrics endpoint and
    shutdown budget are the processor's settings of the same names.
    """

    # The schema of its inbox, reply outbox and positions, in the service's own database (kept
    # apart from the processor's tables, and from the service's own if they share a database).
    schema_name: str = "participant"
    # Its consumer group: every replica of one service shares it, two services never do.
    group_id: str = "saga-participants"
    # Shown in pg_stat_activity.
    application_name: str = "saga-participant"
    # With SAGA_DATABASE__DISTRIBUTED=buckets: how many buckets a new participant schema is made
    # for, its command topics' partition count (a command's bucket follows its key as its
    # partition does). Unset: SAGA_DATABASE__BUCKETS, the processor's input topics' count, which
    # a SagaApp hosting participants shares with them. Recorded when the tables are distributed.
    buckets: int | None = Field(default=None, ge=1, le=4096)

    _check_schema = field_validator("schema_name")(classmethod(lambda cls, v: check_identifier(v)))
