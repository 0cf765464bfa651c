"""`saga reset` on real Kafka and PostgreSQL: a handler bug fixed, the saga replayed from before it.

The transfer's debit-confirmed handler forgets the credit (the bug): the saga waits for a timeout
that would reverse a debit that went through. With the fix deployed, going back before the start
is refused (the debit would be sent again), and going back before the confirmation replays it:
the credit goes out once, the debit was sent once, the history says replayed and the audit trail
names who and why.
"""

from __future__ import annotations

import json
import uuid

import pytest

from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC
from tests.integration.test_operator_decisions import OPERATOR_KEY, _cli
from tests.support.harness import (
    Publisher,
    Reader,
    create_topics,
    query,
    running,
    settings_for,
    wait_until,
)
from tests.unit.test_reset import CONFIRMED, FIXED, REQUESTED, Transfer

pytestmark = pytest.mark.integration

SAGA = "reset-transfer"


def test_a_reset_after_a_handler_fix_sends_each_command_once(
    kafka_bootstrap: str,
    database_url: str,
    pg_schema: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prefix = f"r{uuid.uuid4().hex[:8]}."
    events = prefix + TRANSFER_EVENTS_TOPIC
    create_topics(
        kafka_bootstrap, [events, prefix + ACCOUNT_COMMANDS_TOPIC, prefix + "saga-dead-letters"]
    )
    settings = settings_for(
        kafka_bootstrap,
        database_url,
        pg_schema,
        prefix,
        operator={"key": OPERATOR_KEY, "name": "test-operator"},
    )
    commands = Reader(kafka_bootstrap, [prefix + ACCOUNT_COMMANDS_TOPIC])
    pub = Publisher(kafka_bootstrap)
    tid = REQUESTED.transfer_id

    def history() -> list[tuple[str, str, str]]:
        rows = query(
            database_url,
            pg_schema,
            "SELECT message_id, message_type, outcome FROM saga_history ORDER BY id",
        )
        return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    def types() -> list[str]:
        return [commands.headers(m)["message-type"] for m in commands.records]

    try:
        FIXED["credit"] = False
        with running(settings, [Transfer]):
            pub.event(events, tid, REQUESTED, message_id="m-requested")
            pub.event(events, tid, CONFIRMED, message_id="m-confirmed")
            pub.flush()
            wait_until(
                lambda: (
                    [m for m, _, o in history() if o == "applied"] == ["m-requested", "m-confirmed"]
                ),
                what="both events applied by the buggy handler",
            )
            commands.wait_for(lambda rs: len(rs) >= 1, what="DebitAccount")

        FIXED["credit"] = True  # the fix is deployed
        with running(settings, [Transfer]):
            capsys.readouterr()
            refused = f"saga reset {SAGA} {tid} --before m-requested --reason 'start over'"
            assert _cli(settings, monkeypatch, refused) == 1
            out = capsys.readouterr().out
            assert "send again 1 transfers.DebitAccount" in out
            assert "--resend" in out

            line = f"saga reset {SAGA} {tid} --before m-confirmed --reason 'credit handler fixed'"
            assert _cli(settings, monkeypatch, line) == 0
            commands.wait_for(lambda rs: len(rs) >= 2, what="CreditAccount")
            wait_until(
                lambda: query(database_url, pg_schema, "SELECT count(*) FROM outbox") == [(0,)],
                what="the outbox drained",
            )
        assert types() == ["transfers.DebitAccount", "transfers.CreditAccount"]
        tail = [(m, o) for m, t, o in history() if not t.startswith("operator:")][-1:]
        assert tail == [("m-confirmed", "replayed")]
        [state] = query(
            database_url,
            pg_schema,
            "SELECT state->>'debited', status FROM saga_instance WHERE saga_id = %s",
            tid,
        )
        assert state == ("true", "active")
        # The timeout the bug left is gone: the fixed confirmation cancelled it.
        assert query(database_url, pg_schema, "SELECT count(*) FROM saga_deadline") == [(0,)]

        capsys.readouterr()
        assert _cli(settings, monkeypatch, f"audit list --saga-type {SAGA} --json") == 0
        audited = json.loads(capsys.readouterr().out)
        assert [(a["action"], a["outcome"], a["reason"]) for a in reversed(audited)] == [
            ("reset", "operator-refused", "start over"),
            ("reset", "applied", "credit handler fixed"),
        ]
        assert audited[0]["actor"] == "test-operator"
        assert audited[0]["target"]["name"] == "m-confirmed"
    finally:
        FIXED["credit"] = False
        commands.close()
