"""With the database out of reach, operator commands say so on one line and exit 3."""

from __future__ import annotations

import os

import pytest

from processor.cli import EXIT_UNAVAILABLE, main

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
]


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
