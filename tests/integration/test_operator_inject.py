"""`saga inject` on real Kafka and PostgreSQL: a reply the accounts service lost, given by hand.

The transfer saga waits for `DebitConfirmed`; the operator injects it after a phone call. The
credit command goes out, the audit trail and the timeline say who and why, and the very same
record sent again is a duplicate. An unknown type or an invalid value is refused before anything
is sent (exit 2).
"""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

import pytest

from processor._wire import OPERATOR_COMMAND
from sagas.transfer import TransferSaga
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC, TransferRequested
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

pytestmark = pytest.mark.integration


def test_an_injected_debit_confirmation_moves_the_transfer_on(
    kafka_bootstrap: str,
    database_url: str,
    pg_schema: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    events_topic = prefix + TRANSFER_EVENTS_TOPIC
    create_topics(
        kafka_bootstrap,
        [events_topic, prefix + ACCOUNT_COMMANDS_TOPIC, prefix + "saga-dead-letters"],
    )
    settings = settings_for(
        kafka_bootstrap,
        database_url,
        pg_schema,
        prefix,
        operator={"key": OPERATOR_KEY, "name": "test-operator"},
    )
    commands = Reader(kafka_bootstrap, [prefix + ACCOUNT_COMMANDS_TOPIC])
    inputs = Reader(kafka_bootstrap, [events_topic])
    pub = Publisher(kafka_bootstrap)
    tid = f"tr-{uuid.uuid4().hex[:6]}"
    value = json.dumps({"transfer_id": tid, "account_id": "A", "amount": "10.00"})

    def cli(line: str) -> int:
        return _cli(settings, monkeypatch, line)

    def history() -> list[tuple[str, str, str | None]]:
        rows = query(
            database_url,
            pg_schema,
            "SELECT message_type, outcome, detail FROM saga_history ORDER BY id",
        )
        return [(str(r[0]), str(r[1]), r[2]) for r in rows]

    try:
        with running(settings, [TransferSaga]):
            pub.event(
                events_topic,
                tid,
                TransferRequested(
                    transfer_id=tid,
                    source_account_id="A",
                    target_account_id="B",
                    amount=Decimal("10.00"),
                ),
            )
            pub.flush()
            commands.wait_for(lambda rs: len(rs) >= 1, what="DebitAccount")
            # Refused before anything is sent: an unknown type, a value that is not valid.
            capsys.readouterr()
            nope = f"saga inject transfer-saga {tid} transfers.Nope --json-value '{{}}' --reason x"
            assert cli(nope) == 2
            bad = json.dumps({"transfer_id": tid, "account_id": "A", "amount": "lots-secret"})
            assert (
                cli(
                    f"saga inject transfer-saga {tid} transfers.DebitConfirmed "
                    f"--json-value '{bad}' --reason x"
                )
                == 2
            )
            err = capsys.readouterr().err
            assert "amount" in err
            assert "lots-secret" not in err

            line = (
                f"saga inject transfer-saga {tid} transfers.DebitConfirmed "
                f"--json-value '{value}' --reason 'confirmed by phone'"
            )
            assert cli(line) == 0
            commands.wait_for(lambda rs: len(rs) >= 2, what="CreditAccount")

            # The very record the command sent, sent again: a duplicate, nothing more.
            inputs.wait_for(
                lambda rs: any(inputs.headers(m)["message-type"] == OPERATOR_COMMAND for m in rs),
                what="the operator record",
            )
            [sent] = [
                m for m in inputs.records if inputs.headers(m)["message-type"] == OPERATOR_COMMAND
            ]
            pub.raw(events_topic, sent.key(), sent.value(), sent.headers() or [])
            pub.flush()
            wait_until(
                lambda: [o for _, o, _ in history()][-1:] == ["duplicate"],
                what="the copy recorded as a duplicate",
            )
        types = [commands.headers(m)["message-type"] for m in commands.records]
        assert types == ["transfers.DebitAccount", "transfers.CreditAccount"]
        _, injected, copy = history()
        assert injected[:2] == ("transfers.DebitConfirmed", "applied")
        assert (injected[2] or "").startswith(
            "operator inject transfers.DebitConfirmed by test-operator: confirmed by phone"
        )
        assert copy[1] == "duplicate"

        capsys.readouterr()
        assert cli(f"audit list --saga-type transfer-saga --saga-id {tid} --json") == 0
        [audited] = json.loads(capsys.readouterr().out)
        assert (audited["action"], audited["outcome"], audited["reason"]) == (
            "inject",
            "applied",
            "confirmed by phone",
        )
        assert audited["target"]["name"] == "transfers.DebitConfirmed"
        assert audited["actor"] == "test-operator"
    finally:
        commands.close()
        inputs.close()
