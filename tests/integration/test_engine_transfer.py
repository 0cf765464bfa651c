"""The transfer saga end to end through real Kafka and PostgreSQL, in one processor.

The processor runs as a runtime role with only the grants of deploy/sql/grants.sql, against a
schema its owner role migrated: what a production deployment does.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import psycopg
import pytest

from sagas.transfer import TransferSaga
from schemas.transfers import (
    ACCOUNT_COMMANDS_TOPIC,
    TRANSFER_EVENTS_TOPIC,
    CreditConfirmed,
    DebitConfirmed,
    TransferRequested,
)
from tests.support.harness import (
    Publisher,
    Reader,
    create_topics,
    query,
    running,
    settings_for,
    wait_until,
)
from tests.support.roles import LeastPrivilege

pytestmark = pytest.mark.integration


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}."


@pytest.fixture
def env(kafka_bootstrap: str, least_privilege_db: LeastPrivilege, prefix: str) -> dict[str, str]:
    create_topics(
        kafka_bootstrap,
        [
            prefix + TRANSFER_EVENTS_TOPIC,
            prefix + ACCOUNT_COMMANDS_TOPIC,
            prefix + "saga-dead-letters",
        ],
        partitions=3,
    )
    return {
        "kafka": kafka_bootstrap,
        "db": least_privilege_db.runtime_url,
        "schema": least_privilege_db.schema,
        "prefix": prefix,
    }


def _requested(tid: str) -> TransferRequested:
    return TransferRequested(
        transfer_id=tid, source_account_id="A", target_account_id="B", amount=Decimal("10.00")
    )


def test_transfer_runs_to_the_end_and_commands_leave_in_order(env: dict[str, str]) -> None:
    # The runtime role may not create tables: the owner migrated them.
    settings = settings_for(
        env["kafka"], env["db"], env["schema"], env["prefix"], deadline={"schema": {"auto": False}}
    )
    commands = Reader(env["kafka"], [env["prefix"] + ACCOUNT_COMMANDS_TOPIC])
    pub = Publisher(env["kafka"])
    events = env["prefix"] + TRANSFER_EVENTS_TOPIC
    tid = f"tr-{uuid.uuid4().hex[:6]}"
    try:
        with running(settings, [TransferSaga]):
            pub.event(events, tid, _requested(tid))
            pub.flush()
            commands.wait_for(lambda rs: len(rs) >= 1, what="DebitAccount")
            pub.event(
                events,
                tid,
                DebitConfirmed(transfer_id=tid, account_id="A", amount=Decimal("10.00")),
            )
            pub.event(
                events,
                tid,
                CreditConfirmed(transfer_id=tid, account_id="B", amount=Decimal("10.00")),
            )
            pub.flush()
            commands.wait_for(lambda rs: len(rs) >= 2, what="CreditAccount")
            wait_until(
                lambda: (
                    query(env["db"], env["schema"], "SELECT status FROM saga_instance")
                    == [("ended",)]
                ),
                what="saga ended",
            )
        types = [commands.headers(m)["message-type"] for m in commands.records]
        assert types == ["transfers.DebitAccount", "transfers.CreditAccount"]
        assert all(commands.headers(m)["saga-id"] == tid for m in commands.records)
        assert query(env["db"], env["schema"], "SELECT count(*) FROM outbox") == [(0,)]
        assert query(env["db"], env["schema"], "SELECT count(*) FROM saga_deadline") == [(0,)]
        outcomes = query(
            env["db"], env["schema"], "SELECT outcome, version FROM saga_history ORDER BY id"
        )
        assert outcomes == [("applied", 1), ("applied", 2), ("applied", 3)]
    finally:
        commands.close()


def test_the_runtime_role_reads_and_writes_rows_but_cannot_change_the_schema(
    least_privilege_db: LeastPrivilege,
) -> None:
    url, schema = least_privilege_db.runtime_url, least_privilege_db.schema
    assert query(url, schema, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user") == [
        (False,)
    ]
    assert query(url, schema, "SELECT count(*) FROM saga_instance") == [(0,)]
    for ddl in (
        "CREATE TABLE intruder (id int)",
        "ALTER TABLE outbox ADD COLUMN extra int",
        "TRUNCATE saga_history",
        "DROP TABLE dead_letter",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            query(url, schema, ddl)
