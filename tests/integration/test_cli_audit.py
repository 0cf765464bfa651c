"""The operators' audit trail and `--json` answers, from the command line, on real services.

Dead-letter replays and purges and failed-outbox retries and discards each leave one entry,
written with their effect; `audit list` reads them newest first and narrows them; `show`
lists a saga's own. The commands given `--json` for this print one JSON document, and the
exit codes say found-or-refused (1) apart from usage (2).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from processor._cli import main
from processor._postgres.connect import connect, ensure_schema
from processor._postgres.schema.tables import MIGRATIONS, Tables

pytestmark = pytest.mark.integration

Cli = Callable[..., tuple[int, str]]


@pytest.fixture
def cli(
    database_url: str,
    pg_schema: str,
    kafka_bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Cli:
    """Runs `saga-processor ARGS...` over this test's schema; returns the exit code and stdout."""
    ensure_schema(database_url, Tables(pg_schema))
    monkeypatch.setenv("SAGA_DATABASE__URL", database_url)
    monkeypatch.setenv("SAGA_DATABASE__SCHEMA_NAME", pg_schema)
    monkeypatch.setenv("SAGA_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("SAGA_OPERATOR__NAME", "ana")
    monkeypatch.setenv("SAGA_SAGAS", '["sagas.order:OrderSaga"]')

    def run(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main(list(args))
        return code, capsys.readouterr().out

    return run


def _json(done: tuple[int, str], code: int = 0) -> Any:
    assert done[0] == code, done
    return json.loads(done[1])


def _seed(database_url: str, pg_schema: str, topic: str) -> tuple[list[int], list[int]]:
    """Three dead letters from ``topic``, and saga `transfer big`'s failed outbox rows."""
    tables = Tables(pg_schema)
    with connect(database_url, autocommit=True) as conn:
        letters = [
            conn.execute(
                tables.render(
                    'INSERT INTO {dead_letter} (topic, partition, "offset", key, value, headers,'
                    " reason, detail) VALUES (%s, 0, %s, %s, %s, %s, 'undecodable', 'bad json')"
                    " RETURNING id"
                ),
                (topic, n, b"k", b"{", Jsonb({"message-id": f"m-{n}"})),
            ).fetchone()[0]  # type: ignore[index]
            for n in range(3)
        ]
        now = datetime.now(UTC)
        failed = [41, 42]
        for i in failed:
            conn.execute(
                tables.render(
                    "INSERT INTO {failed_outbox} (id, saga_type, saga_id, topic, key, headers,"
                    " value, created_at, reason, attempts, held_behind)"
                    " VALUES (%s, 'transfer', 'big', 'commands', NULL, %s, %s, %s, %s, 1, %s)"
                ),
                (i, Jsonb({"message-id": f"big-{i}"}), b"{}", now, "too large", None),
            )
        conn.execute(
            tables.render(
                "INSERT INTO {instance} (saga_type, saga_id, state, status, version)"
                " VALUES ('transfer', 'big', '{{}}', 'active', 3)"
            )
        )
    return letters, failed


def test_destructive_actions_are_audited_and_listed(
    cli: Cli, database_url: str, pg_schema: str, make_topic: Callable[..., str]
) -> None:
    letters, failed = _seed(database_url, pg_schema, make_topic())

    replayed = _json(cli("dead-letters", "replay", str(letters[0]), "--reason", "fixed", "--json"))
    assert replayed["id"] == letters[0]
    assert (
        _json(cli("dead-letters", "purge", "--id", str(letters[1]), "--reason", "junk", "--json"))[
            "purged"
        ]
        == 1
    )
    # Named but not there: nothing done, exit 1, nothing recorded.
    assert cli("dead-letters", "purge", "--id", str(letters[1]), "--reason", "again")[0] == 1
    assert (
        _json(cli("dead-letters", "purge", "--older-than", "0s", "--reason", "all", "--json"))[
            "purged"
        ]
        == 1
    )
    big = ("--saga-type", "transfer", "--saga-id", "big")
    retried = _json(cli("outbox", "failed", "retry", "--id", str(failed[1]), "--json"))
    assert [r["id"] for r in retried["rows"]] == failed
    assert cli("outbox", "failed", "discard", *big, "--reason", "gone")[0] == 1

    entries = _json(cli("audit", "list", "--json"))
    assert [(e["action"], e["outcome"], e["actor"], e["reason"]) for e in entries] == [
        ("outbox-retry", "retried", "ana", None),
        ("dead-letter-purge", "purged", "ana", "all"),
        ("dead-letter-purge", "purged", "ana", "junk"),
        ("dead-letter-replay", "replayed", "ana", "fixed"),
    ]
    retry, purge_all, purge_one, replay = entries
    assert (retry["saga_type"], retry["saga_id"]) == ("transfer", "big")
    assert retry["target"] == {"row_id": failed[1], "count": 2, "ids": failed}
    assert purge_all["target"] == {"older_than_seconds": 0.0, "count": 1, "ids": [letters[2]]}
    assert purge_one["target"] == {"count": 1, "ids": [letters[1]]}
    assert replay["target"]["ids"] == [letters[0]]
    assert replay["target"]["message_id"] == "m-0"

    narrowed = _json(
        cli("audit", "list", "--action", "dead-letter-purge", "--since", "1h", "--json")
    )
    assert [e["id"] for e in narrowed] == [purge_all["id"], purge_one["id"]]
    assert _json(cli("audit", "list", "--saga-type", "transfer", "--saga-id", "big", "--json")) == [
        retry
    ]
    assert _json(cli("audit", "list", "--limit", "1", "--json")) == [retry]
    code, text = cli("audit", "list", "--saga-type", "transfer")
    assert code == 0
    assert text.splitlines()[0].split() == [
        "AT",
        "ACTOR",
        "ACTION",
        "SAGA",
        "OUTCOME",
        "REASON",
        "TARGET",
    ]
    assert "outbox-retry" in text
    assert "transfer big" in text

    shown = _json(cli("show", "transfer", "big", "--json"))
    assert [a["action"] for a in shown["audit"]] == ["outbox-retry"]
    code, text = cli("show", "transfer", "big")
    assert code == 0
    [line] = [ln for ln in text.splitlines() if "outbox-retry" in ln]
    assert " ana  outbox-retry  retried: -  " in line


def test_exit_codes_tell_refused_from_usage(cli: Cli) -> None:
    assert cli("show", "transfer", "nope")[0] == 1
    assert cli("dead-letters", "show", "999999")[0] == 1
    assert cli("outbox", "failed", "retry", "--id", "999999")[0] == 1
    assert cli("outbox", "failed", "retry", "--saga-id", "x")[0] == 2
    assert cli("dead-letters", "purge", "--reason", "r")[0] == 2
    assert cli("parked", "skip", "transfer", "x")[0] == 2  # no --reason


def test_the_commands_answer_in_json(
    cli: Cli, database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _json(cli("migrate", "--json")) == {"schema": pg_schema, "version": len(MIGRATIONS)}
    plan = _json(cli("migrate", "--sql", "--json"))
    assert (plan["current"], plan["target"], plan["sql"]) == (len(MIGRATIONS),) * 2 + ("",)
    checked = _json(cli("check", "--skip-topics", "--json"))
    assert checked["ok"] is True
    assert checked["problems"] == []
    assert set(checked) == {"ok", "problems", "notes", "counts", "schema_newer"}
    assert _json(cli("audit", "list", "--json")) == []
    assert _json(cli("parked", "retry", "--all", "--reason", "fixed", "--json")) == {
        "parked": 0,
        "matched": 0,
        "sent": [],
        "not_sent": [],
    }
    # The participant's tables in a schema of this test's own, dropped with the test.
    participant = f"{pg_schema}_p"
    monkeypatch.setenv("SAGA_PARTICIPANT__SCHEMA_NAME", participant)
    try:
        assert _json(cli("participant", "migrate", "--json")) == {
            "schema": participant,
            "applied": 0,
        }
    finally:
        with connect(database_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(participant))
            )
