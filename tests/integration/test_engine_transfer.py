"""The transfer saga end to end through real Kafka and PostgreSQL, in one processor."""

from __future__ import annotations

import uuid
from decimal import Decimal

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

pytestmark = pytest.mark.integration


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}."


@pytest.fixture
def env(kafka_bootstrap: str, database_url: str, pg_schema: str, prefix: str) -> dict[str, str]:
    create_topics(
        kafka_bootstrap,
        [
            prefix + TRANSFER_EVENTS_TOPIC,
            prefix + ACCOUNT_COMMANDS_TOPIC,
            prefix + "saga-dead-letters",
        ],
        partitions=3,
    )
    return {"kafka": kafka_bootstrap, "db": database_url, "schema": pg_schema, "prefix": prefix}


def _requested(tid: str) -> TransferRequested:
    return TransferRequested(
        transfer_id=tid, source_account_id="A", target_account_id="B", amount=Decimal("10.00")
    )


def test_transfer_runs_to_the_end_and_commands_leave_in_order(env: dict[str, str]) -> None:
    settings = settings_for(env["kafka"], env["db"], env["schema"], env["prefix"])
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
