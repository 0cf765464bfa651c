"""Contract suites: the same cases against the in-memory adapters and the PostgreSQL ones.

Each suite's fixture is parametrized by ``BACKENDS``; the PostgreSQL side is an integration
test, over a schema of its own.
"""

from __future__ import annotations

import pytest

__all__ = ["BACKENDS", "postgres_args"]

BACKENDS = ["memory", pytest.param("postgres", marks=pytest.mark.integration)]


def postgres_args(request: pytest.FixtureRequest) -> tuple[str, str] | None:
    """(database URL, schema) when the fixture's parameter is PostgreSQL; None for memory."""
    if request.param == "memory":
        return None
    return request.getfixturevalue("database_url"), request.getfixturevalue("pg_schema")
