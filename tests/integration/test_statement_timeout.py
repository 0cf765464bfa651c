"""The loops' connections bound each statement; a statement cut off by it is a retryable failure.

Against a real PostgreSQL: a loop whose query runs past ``SAGA_DATABASE__STATEMENT_TIMEOUT`` is
cancelled by the server (57014) and the failure is one the loops try again, not one that ends
the process. Operator connections are not bounded by it.
"""

from __future__ import annotations

import psycopg
import pytest

from processor._bootstrap.adapters import Adapters
from processor._errors import Failure, Retryable
from processor._postgres.connect import connect
from processor._postgres.errors import translate
from processor.settings import ProcessorSettings

pytestmark = pytest.mark.integration


def _processor(database_url: str, **database: str) -> Adapters:
    """The adapters a processor's loops connect through."""
    settings = ProcessorSettings(sagas=["sagas"], database={"url": database_url, **database})
    return Adapters(settings)


def test_the_loops_connections_carry_the_default_statement_timeout(database_url: str) -> None:
    with _processor(database_url).connect() as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("1min",)
    with connect(database_url) as operator:
        assert operator.execute("SHOW statement_timeout").fetchone() == ("0",)


def test_a_statement_past_the_timeout_is_cancelled_and_retryable(database_url: str) -> None:
    with _processor(database_url, statement_timeout="200ms").connect() as conn:
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("SELECT pg_sleep(5)")
        assert raised.value.sqlstate == "57014"
        failure = translate(raised.value)
        assert isinstance(failure, Retryable)
        assert failure.kind is Failure.RETRYABLE
        conn.rollback()
        assert conn.execute("SELECT 1").fetchone() == (1,)
