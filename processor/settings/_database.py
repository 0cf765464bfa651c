"""The PostgreSQL settings: the server, the processor's schema, how long a statement may run."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator

from processor.settings._values import Duration, check_identifier

__all__ = ["DatabaseSettings", "Distributed"]

Distributed = Literal["auto", "off", "citus", "buckets"]
"""``citus``: the database must have the citus extension, and the processor's schema is made a
Citus distributed schema (processor/_postgres/schema/citus.py), its tables moved to a worker if they
were plain; ``buckets``: the database must have the citus extension, and the processor's tables are
distributed by bucket over the workers (processor/_postgres/schema/buckets.py), a new schema only;
``off``: plain tables, on a Citus coordinator too; ``auto``: a new schema is distributed where the
database has the extension, and an existing plain one stays as it is."""


class DatabaseSettings(BaseModel):
    """The PostgreSQL server and the schema that holds the processor's tables."""

    # Required: a default would carry a password, and would silently point a misconfigured
    # replica at whatever database happens to answer there.
    url: SecretStr
    schema_name: str = "saga"
    # The longest one statement of the processor's loops may run (consumer batches, relay,
    # deadline poller, retention, growth watch, metrics samples); the server cancels it past
    # that and the loop tries again. Operator commands and migrations are not bounded by it.
    statement_timeout: Duration = timedelta(seconds=60)
    distributed: Distributed = "auto"
    # With distributed=buckets: how many buckets a new schema's tables are made for, the input
    # topics' partition count (grow topics to multiples of it to keep batches on one worker).
    # Recorded when the tables are distributed; later starts read it from the database.
    buckets: int | None = Field(default=None, ge=1, le=4096)

    _check_schema = field_validator("schema_name")(classmethod(lambda cls, v: check_identifier(v)))
