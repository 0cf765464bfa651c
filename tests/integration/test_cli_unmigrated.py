"""Every command that reads the processor's tables, on a schema that was never migrated.

The schema exists but is empty (created, never migrated), or does not exist at all. Each command
says so in one line naming the fix, `saga-processor migrate`, and exits 1 (refused: the database
answered, and the answer is no, as `check` reports a schema behind the code); no traceback, no
client notice. With `--json` stdout is one JSON document with `"ok": false`. The commands run
in-process, as tests/unit/test_cli_unavailable.py runs them against a database that is down.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from processor._cli import COMMANDS, EXIT_REFUSED, NO_JSON, main

pytestmark = pytest.mark.integration

# One line per action, the smallest valid arguments; each takes `--json`.
LINES = [
    "check",
    "check --skip-topics",
    "show order-saga o-1",
    "sagas list",
    "sagas stuck",
    "saga cancel order-saga o-1 --reason test",
    "saga terminate order-saga o-1 --reason test --force",
    "saga resolve order-saga o-1 retry --reason test",
    "deadlines order-saga o-1",
    "deadlines fire-now order-saga o-1 remind --reason test",
    "deadlines cancel order-saga o-1 remind --reason test",
    "overdue",
    "states",
    "retry order-saga o-1",
    "parked",
    "parked retry order-saga o-1 --reason test",
    "parked skip order-saga o-1 --reason test",
    "parked retry --all --reason test",
    "dead-letters list",
    "dead-letters show 1",
    "dead-letters replay 1 --reason test",
    "dead-letters purge --id 1 --reason test",
    "audit list",
    "outbox failed list",
    "outbox failed retry --id 1",
    "outbox failed discard --id 1 --reason test",
]
# Commands that touch the database but are not walked here, and why.
EXCLUDED = {
    # Serve until stopped; they wait for the database rather than exit, and take no --json.
    "run": "long-running",
    "console": "long-running",
    # `participant run` serves until stopped; `participant migrate` creates the participant's
    # own schema: it is a fix, not a reader.
    "participant": "long-running, or the participant's migrate",
    # The fix itself: it creates the schema (see the last test).
    "migrate": "the fix",
    # Reads the Citus catalog, not the processor's tables: `show` says "not a Citus database"
    # on PostgreSQL, `move` refuses there (exit 2).
    "citus-node": "reads no table of the schema",
}
# Commands that never open the database.
NO_DATABASE = {"topics", "diagram", "lint-saga", "schemas"}


def test_every_command_is_walked_or_excluded_by_name() -> None:
    names = {c.name for c in COMMANDS}
    assert {c.name for c in COMMANDS if c.offline or not c.database} == NO_DATABASE
    walked = {line.split()[0] for line in LINES}
    assert walked | set(EXCLUDED) | NO_DATABASE == names, "walk or exclude the new command"
    assert walked.isdisjoint(EXCLUDED)
    assert walked.isdisjoint(NO_DATABASE)
    assert {"run", "console"} == NO_JSON


@pytest.fixture(params=["empty", "missing"])
def unmigrated(
    request: pytest.FixtureRequest, database_url: str, kafka_bootstrap: str
) -> Iterator[str]:
    """SAGA_* pointing at a schema created but never migrated, or at one that does not exist."""
    name = f"t_unmigrated_{request.param}_{uuid.uuid4().hex[:8]}"
    if request.param == "empty":
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    mp = pytest.MonkeyPatch()
    for key in [k for k in os.environ if k.startswith("SAGA_")]:
        mp.delenv(key)
    mp.setenv("SAGA_SAGAS", '["sagas.order:OrderSaga"]')
    mp.setenv("SAGA_DATABASE__URL", database_url)
    mp.setenv("SAGA_DATABASE__SCHEMA_NAME", name)
    mp.setenv("SAGA_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    mp.setenv("SAGA_OPERATOR__KEY", "k")
    try:
        yield name
        # Nothing made a table, nor the schema that was missing.
        with psycopg.connect(database_url, autocommit=True) as conn:
            found = conn.execute(
                "SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = %s), "
                "(SELECT count(*) FROM information_schema.tables WHERE table_schema = %s)",
                (name, name),
            ).fetchone()
        assert found == ((1 if request.param == "empty" else 0), 0)
    finally:
        mp.undo()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.mark.parametrize("line", LINES)
def test_a_command_on_an_unmigrated_schema_names_migrate_in_one_line(
    line: str, unmigrated: str, capfd: pytest.CaptureFixture[str]
) -> None:
    assert main(line.split()) == EXIT_REFUSED
    out, err = capfd.readouterr()
    # One line, at the file descriptor too (no traceback, no client library notice).
    [said] = err.strip().splitlines()
    assert said.startswith(f"saga-processor: the schema {unmigrated} in database ")
    assert "is not migrated (or is older than this release): run `saga-processor migrate`" in said

    assert main([*line.split(), "--json"]) == EXIT_REFUSED
    out, err = capfd.readouterr()
    document = json.loads(out)
    assert document["ok"] is False
    assert document["exit_code"] == EXIT_REFUSED
    assert "run `saga-processor migrate`" in document["error"]
    assert err.strip().splitlines() == [said]


def test_migrate_is_the_fix(unmigrated: str, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["sagas", "list"]) == EXIT_REFUSED
    assert main(["migrate"]) == 0
    assert main(["sagas", "list", "--json"]) == 0
    out = capfd.readouterr().out  # after what `migrate` printed
    assert json.loads(out[out.rindex('{\n  "next"') :]) == {"sagas": [], "next": None}
    with psycopg.connect(os.environ["SAGA_DATABASE__URL"], autocommit=True) as conn:
        # Left as the fixture expects to find it: nothing made.
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(unmigrated)))
        if "empty" in unmigrated:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(unmigrated)))
