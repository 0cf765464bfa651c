"""The PostgreSQL outbox store after its connection is lost: Retryable, then a fresh one."""

from __future__ import annotations

import uuid

import pytest

from processor._errors import Retryable
from processor._postgres.connect import connect, ensure_schema
from processor._postgres.outbox import PostgresOutboxStore
from processor._postgres.schema.tables import Tables

pytestmark = pytest.mark.integration


def test_a_killed_connection_fails_one_claim_and_the_next_reconnects(
    database_url: str, pg_schema: str
) -> None:
    tables = Tables(schema=pg_schema)
    ensure_schema(database_url, tables)
    name = f"outbox-{uuid.uuid4().hex[:8]}"
    store = PostgresOutboxStore(lambda: connect(database_url, application_name=name), tables)
    with connect(database_url, autocommit=True) as admin:
        admin.execute(
            tables.render("INSERT INTO {outbox} (topic, headers, value) VALUES ('t', '{{}}', 'v')")
        )

        def claim_while_killed() -> None:
            with store.claim(10) as first:
                assert first is not None
                assert len(first) == 1
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = %s",
                    (name,),
                )

        with pytest.raises(Retryable):
            claim_while_killed()
        # Nothing was removed, and the next call works on a new connection.
        assert admin.execute(tables.render("SELECT count(*) FROM {outbox}")).fetchone() == (1,)
        with store.claim(10) as again:
            assert again is not None
            assert len(again) == 1
        assert admin.execute(tables.render("SELECT count(*) FROM {outbox}")).fetchone() == (0,)
    store.close()
