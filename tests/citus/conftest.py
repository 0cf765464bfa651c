"""The Citus tests' database: `SAGA_TEST_DATABASE_URL` must be a Citus coordinator.

`make test` runs them in its citus phase (tests/run.py) with that variable pointed at the local
Citus cluster (deploy/local/citus.sh) or at `SAGA_TEST_CITUS_URL`; anywhere else they skip.
"""

from __future__ import annotations

import psycopg
import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "citus" in item.path.parts:
            item.add_marker(pytest.mark.citus)


@pytest.fixture(scope="session")
def citus_url(database_url: str) -> str:
    """The coordinator's URL; the test is skipped when the database is not Citus."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'").fetchone()
    if found is None:
        pytest.skip("the test database is not a Citus coordinator (make test's citus phase)")
    return database_url
