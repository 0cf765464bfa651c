"""Every command answers in one JSON document with `--json`, but those that serve until stopped.

Each subcommand (and each of its actions) accepts `--json`; `run` and `console` serve until
stopped, their log being their output. The commands that need no service are run here too; the
others' JSON is read in tests/integration/test_cli_audit.py.
"""

from __future__ import annotations

import argparse
import json

import pytest

from processor._cli import COMMANDS, NO_JSON, build_parser, main

# One command line per command, without `--json`.
SAMPLES = {
    "participant": "participant migrate",
    "migrate": "migrate --sql",
    "check": "check --skip-topics",
    "citus-node": "citus-node move --reason test",
    "topics": "topics plan",
    "show": "show order-saga o-1",
    "sagas": "sagas stuck --older-than 2h",
    "saga": "saga terminate order-saga o-1 --reason r --force --no-wait",
    "deadlines": "deadlines order-saga o-1",
    "overdue": "overdue",
    "diagram": "diagram sagas.order:OrderSaga",
    "lint-saga": "lint-saga sagas.order:OrderSaga",
    "states": "states",
    "retry": "retry order-saga o-1",
    "parked": "parked skip order-saga o-1 --reason r --no-wait",
    "dead-letters": "dead-letters purge --older-than 30d --reason r",
    "audit": "audit list --since 2h --saga-type order-saga --saga-id o-1 --action terminate",
    "outbox": "outbox failed discard --id 3 --reason r",
    "schemas": "schemas sagas.order",
}


def _leaves(
    parser: argparse.ArgumentParser, path: str
) -> list[tuple[str, argparse.ArgumentParser]]:
    """The parsers that take options: those with no further subcommands, by command path."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(path, parser)]
    return [
        leaf
        for a in subs
        for name, child in a.choices.items()
        for leaf in _leaves(child, f"{path} {name}".strip())
    ]


def test_every_command_has_a_sample_or_serves_until_stopped() -> None:
    names = {c.name for c in COMMANDS}
    assert names - NO_JSON == set(SAMPLES)
    assert names >= NO_JSON


def test_every_action_of_every_command_but_the_servers_takes_json() -> None:
    leaves = _leaves(build_parser(), "")
    without = sorted(path for path, p in leaves if "--json" not in p._option_string_actions)
    assert without == sorted(NO_JSON)
    # The walk reaches the actions below the commands.
    assert {"outbox failed discard", "dead-letters replay", "audit list"} <= {p for p, _ in leaves}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_command_line_with_json_parses(name: str) -> None:
    args = build_parser().parse_args([*SAMPLES[name].split(), "--json"])
    assert args.command == name
    assert args.json is True


def test_the_offline_commands_print_one_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagram", "sagas.order:OrderSaga", "--json"]) == 0
    drawn = json.loads(capsys.readouterr().out)
    assert drawn["format"] == "mermaid"
    assert drawn["diagram"].startswith("stateDiagram-v2")
    assert main(["lint-saga", "sagas.order:OrderSaga", "--json"]) == 0
    linted = {"ok": True, "problems": [], "checked": ["order-saga"]}
    assert json.loads(capsys.readouterr().out) == linted
    assert main(["schemas", "sagas.order", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["asyncapi"] == "3.0.0"


def test_topics_plan_needs_no_database(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SAGA_DATABASE__URL", raising=False)
    monkeypatch.setenv("SAGA_SAGAS", '["sagas"]')
    assert main(["topics", "plan", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert {"topic": "transfer-events", "role": "reads"}.items() <= planned[0].items()
    # A command that connects still asks for it, naming the variable.
    assert main(["sagas", "list"]) == 2
    assert "SAGA_DATABASE__URL" in capsys.readouterr().err


def test_an_error_with_json_is_one_document_on_stdout_and_one_line_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SAGA_APP", raising=False)
    # A usage mistake (no saga named): exit 2.
    assert main(["diagram", "--json"]) == 2
    out, err = capsys.readouterr()
    said = json.loads(out)
    assert said == {"ok": False, "error": said["error"], "exit_code": 2}
    assert err.strip().splitlines() == [f"saga-processor: {said['error']}"]
    # A database out of reach: exit 3.
    monkeypatch.setenv("SAGA_SAGAS", '["sagas"]')
    monkeypatch.setenv("SAGA_DATABASE__URL", "postgresql://saga@127.0.0.1:1/saga")
    assert main(["sagas", "list", "--json"]) == 3
    out, err = capsys.readouterr()
    assert json.loads(out)["exit_code"] == 3
    assert "the database is unreachable" in json.loads(out)["error"]
    # Without --json, stdout stays empty.
    assert main(["sagas", "list"]) == 3
    assert capsys.readouterr().out == ""
