"""What the operator commands say when a request is refused, on real Kafka and PostgreSQL.

A `saga cancel` signed with a key the processor does not hold is dead-lettered as
`unauthenticated`: the command finds that dead letter while it waits, says the signature was not
accepted and exits 1 at once, rather than waiting out `--wait` and blaming the processors.
A command at its default log level prints its answer alone: no librdkafka notice on stderr.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from decimal import Decimal

import pytest

from processor._cli import EXIT_REFUSED, main
from processor.settings import ProcessorSettings
from sagas.transfer import TransferSaga
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC, TransferRequested
from tests.support.harness import (
    Publisher,
    Reader,
    create_topics,
    query,
    running,
    settings_for,
)
from tests.support.procs import settings_env

pytestmark = pytest.mark.integration


def _env(settings: ProcessorSettings, mp: pytest.MonkeyPatch, **override: str) -> None:
    for name, value in {**settings_env(settings), **override}.items():
        mp.setenv(name, value)


def test_a_cancel_signed_with_a_wrong_key_is_refused_at_once(
    kafka_bootstrap: str,
    database_url: str,
    pg_schema: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    create_topics(
        kafka_bootstrap,
        [prefix + t for t in (TRANSFER_EVENTS_TOPIC, ACCOUNT_COMMANDS_TOPIC, "saga-dead-letters")],
    )
    settings = settings_for(
        kafka_bootstrap,
        database_url,
        pg_schema,
        prefix,
        operator={"key": "the-processors-key", "name": "test-operator"},
    )
    _env(settings, monkeypatch, SAGA_OPERATOR__KEY="not-the-processors-key")
    commands = Reader(kafka_bootstrap, [prefix + ACCOUNT_COMMANDS_TOPIC])
    pub = Publisher(kafka_bootstrap)
    tid = f"tr-{uuid.uuid4().hex[:6]}"
    try:
        with running(settings, [TransferSaga]):
            requested = TransferRequested(
                transfer_id=tid, source_account_id="A", target_account_id="B", amount=Decimal("1")
            )
            pub.event(prefix + TRANSFER_EVENTS_TOPIC, tid, requested)
            pub.flush()
            commands.wait_for(lambda rs: len(rs) >= 1, what="DebitAccount")
            capfd.readouterr()
            began = time.monotonic()
            line = f"saga cancel transfer-saga {tid} --reason 'customer called' --wait 60"
            assert main(shlex.split(line)) == EXIT_REFUSED
            took = time.monotonic() - began
            err = capfd.readouterr().err
            # The processor's own log lines share stderr here (it runs in this process).
            [said] = [ln for ln in err.splitlines() if ln.startswith("saga-processor: ")]
            assert "refused: the processor did not accept its signature" in said
            assert "dead-lettered as unauthenticated" in said
            assert took < 20, f"{took:.1f} s: the refusal was not noticed while waiting"
            # With --json: one document on stdout saying the same.
            assert main([*shlex.split(line), "--json"]) == EXIT_REFUSED
            document = json.loads(capfd.readouterr().out)
            assert document["ok"] is False
            assert document["exit_code"] == EXIT_REFUSED
            assert "did not accept its signature" in document["error"]
        # Nothing was cancelled: the saga still waits for its debit.
        assert query(database_url, pg_schema, "SELECT status FROM saga_instance") == [("active",)]
        reasons = query(database_url, pg_schema, "SELECT reason FROM dead_letter")
        assert reasons == [("unauthenticated",), ("unauthenticated",)]
    finally:
        commands.close()


def test_a_command_at_the_default_level_prints_no_client_notice(
    kafka_bootstrap: str,
    database_url: str,
    pg_schema: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    settings = settings_for(
        kafka_bootstrap, database_url, pg_schema, prefix, operator={"key": "k", "name": "me"}
    )
    _env(settings, monkeypatch)
    assert main(["migrate"]) == 0
    capfd.readouterr()
    # The command opens an idempotent producer (whose configuration librdkafka remarks on)
    # before it finds that there is no such saga.
    assert main(shlex.split("saga cancel transfer-saga nope --reason test")) == EXIT_REFUSED
    err = capfd.readouterr().err  # at the file descriptor: librdkafka's own writes too
    assert err.strip().splitlines() == ["saga-processor: no saga transfer-saga nope"]
    assert "%6|" not in err
    assert "librdkafka" not in err
