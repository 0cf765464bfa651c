"""With the database or the broker out of reach, operator commands say so on one line, exit 3."""

from __future__ import annotations

import os

import pytest

from processor._cli import EXIT_UNAVAILABLE, main
from processor._kafka import admin

COMMANDS = [
    "migrate",
    "participant migrate",
    "show order-saga o-1",
    "sagas list",
    "sagas stuck",
    "saga cancel order-saga o-1 --reason test",
    "saga terminate order-saga o-1 --reason test --force",
    "saga resolve order-saga o-1 retry --reason test",
    "deadlines order-saga o-1",
    "overdue",
    "states",
    "parked",
    "dead-letters list",
    "outbox failed list",
    "audit list",
    "audit list --saga-type order-saga --since 2h --json",
    "check",
    "citus-node",
    "citus-node move --reason test",
    "retry order-saga o-1",
    "parked retry order-saga o-1 --reason test",
    "parked skip order-saga o-1 --reason test",
    "deadlines fire-now order-saga o-1 remind --reason test",
    "deadlines cancel order-saga o-1 remind --reason test",
    "dead-letters show 1",
    "dead-letters replay 1 --reason test",
    "dead-letters purge --id 1 --reason test",
    "outbox failed retry --id 1",
    "outbox failed discard --id 1 --reason test",
]
# Commands that need no database: offline ones, the broker's own, the long-running ones (whose
# outage handling is the processor's: they wait for the database rather than exit).
NOT_DATABASE = {"diagram", "lint-saga", "schemas", "topics", "run", "console", "participant run"}


def test_every_command_that_needs_the_database_is_checked_here() -> None:
    from processor._cli import COMMANDS as ALL

    covered = {line.split()[0] for line in COMMANDS}
    missing = {c.name for c in ALL} - covered - NOT_DATABASE
    assert missing == set(), f"add a line for {sorted(missing)} to COMMANDS"


@pytest.mark.parametrize("line", COMMANDS)
def test_a_command_without_its_database_exits_3_with_one_line(
    line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [n for n in os.environ if n.startswith("SAGA_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SAGA_SAGAS", '["sagas.order:OrderSaga"]')
    # Port 1 refuses at once: what a stopped PostgreSQL looks like.
    monkeypatch.setenv("SAGA_DATABASE__URL", "postgresql://saga:secret@127.0.0.1:1/saga")
    monkeypatch.setenv("SAGA_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("SAGA_OPERATOR__KEY", "k")
    assert main(line.split()) == EXIT_UNAVAILABLE
    # One line: no traceback, no client library notices (a command logs at WARNING and up).
    [err] = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("saga-processor: the database is unreachable: ")
    assert "secret" not in err


def test_a_command_without_its_broker_exits_3_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [n for n in os.environ if n.startswith("SAGA_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SAGA_SAGAS", '["sagas.order:OrderSaga"]')
    monkeypatch.setenv("SAGA_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("SAGA_DATABASE__URL", "postgresql://saga@127.0.0.1:1/saga")  # not used
    # The cluster's metadata is awaited 15 s; a refused connection says as much in 1.
    counts = admin.partition_counts
    monkeypatch.setattr(admin, "partition_counts", lambda c, t, _: counts(c, t, timeout=1.0))
    assert main(["topics", "check", "--json"]) == EXIT_UNAVAILABLE
    # One line: librdkafka's own complaints go to the log (WARNING and up is shown), not stderr
    # as they come.
    [err] = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("saga-processor: the Kafka cluster did not answer: ")
