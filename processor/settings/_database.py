"""The PostgreSQL settings: the server, the processor's schema, how long a statement may run."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, SecretStr, field_validator

from processor.settings._values import Duration, check_identifier

__all__ = ["DatabaseSettings", "Distributed"]

Distributed = Literal["auto", "off", "citus"]
"""``citus``: the database must have the citus extension, and the processor's schema is made a
Citus distributed schema (processor/_postgres/schema/citus.py), its tables moved to a worker if they
were plain; ``off``: plain tables, on a Citus coordinator too; ``auto``: a new schema is distributed
where the database has the extension, and an existing plain one stays as it is."""


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

    _check_schema = field_validator("schema_name")(classmethod(lambda cls, v: check_identifier(v)))
