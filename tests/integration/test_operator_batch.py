"""`saga cancel --where ...` from the CLI on real Kafka and PostgreSQL: one batch, 200 sagas.

200 transfers wait for their debit to be confirmed; three more had it confirmed (their state no
longer matches) and two ended when their debit failed (ended sagas are left alone unless the
filter names a status). A dry run lists exactly the 200 and sends nothing; off a terminal, a
batch over `--confirm-over` is refused without `--yes` and sends nothing; with `--yes` each of the
200 is cancelled once, so each debit is reversed exactly once and nothing else moves, and
`audit list --batch` shows the batch's own entry and one entry per saga carrying its id.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import sys
import time
import uuid
from collections import Counter
from decimal import Decimal

import pytest

from processor._cli import main
from processor.settings import ProcessorSettings
from sagas.transfer import TransferSaga
from schemas.transfers import (
    ACCOUNT_COMMANDS_TOPIC,
    TRANSFER_EVENTS_TOPIC,
    DebitConfirmed,
    DebitFailed,
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
from tests.support.procs import settings_env

pytestmark = pytest.mark.integration

HELD = 200
WHERE = "--where type=transfer-saga --where attr=debit_confirmed=false"


def test_a_batch_cancel_compensates_every_matching_saga_once_and_nothing_else(
    kafka_bootstrap: str,
    database_url: str,
    pg_schema: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    events, commands_topic = prefix + TRANSFER_EVENTS_TOPIC, prefix + ACCOUNT_COMMANDS_TOPIC
    create_topics(kafka_bootstrap, [events, commands_topic, prefix + "saga-dead-letters"], 3)
    settings = settings_for(
        kafka_bootstrap,
        database_url,
        pg_schema,
        prefix,
        operator={"key": "batch-operator-key", "name": "batch-operator"},
    )
    commands = Reader(kafka_bootstrap, [commands_topic])
    pub = Publisher(kafka_bootstrap)
    run = uuid.uuid4().hex[:6]
    held = [f"b-{run}-{n:03d}" for n in range(HELD)]
    confirmed = [f"c-{run}-{n}" for n in range(3)]
    failed = [f"f-{run}-{n}" for n in range(2)]

    def cli(line: str) -> tuple[int, str, str]:
        code = _cli(settings, monkeypatch, line)
        out, err = capsys.readouterr()
        return code, out, err

    def db(sql: str, *args: object) -> list[tuple[object, ...]]:
        return query(database_url, pg_schema, sql, *args)

    try:
        with running(settings, [TransferSaga]):
            for tid in held + confirmed + failed:
                pub.event(events, tid, _requested(tid))
            for tid in confirmed:
                pub.event(
                    events, tid, DebitConfirmed(transfer_id=tid, account_id="A", amount=Decimal(10))
                )
            for tid in failed:
                pub.event(events, tid, DebitFailed(transfer_id=tid, account_id="A", reason="no"))
            pub.flush()
            shape = (
                "SELECT count(*) FILTER (WHERE status = 'active' AND version = 1),"
                " count(*) FILTER (WHERE status = 'active' AND version = 2),"
                " count(*) FILTER (WHERE status = 'ended') FROM saga_instance"
            )
            wait_until(lambda: db(shape) == [(HELD, 3, 2)], 60, "the transfers in flight")
            commands.wait_for(lambda rs: len(rs) >= HELD + 5 + 3, what="debits and credits")

            # A dry run lists exactly the 200, and touches nothing.
            code, out, _ = cli(f"saga cancel {WHERE} --dry-run --json")
            assert code == 0
            listed = json.loads(out)
            assert (listed["matched"], listed["capped"]) == (HELD, False)
            assert sorted(s["saga_id"] for s in listed["sagas"]) == held
            assert {s["status"] for s in listed["sagas"]} == {"active"}
            code, out, _ = cli(f"saga cancel {WHERE} --dry-run")
            assert code == 0
            said = f"{HELD} sagas match: `saga cancel` would touch them (dry run: nothing sent)"
            assert out.splitlines()[-1] == said

            # Off a terminal, over the confirmation threshold and without --yes: refused.
            monkeypatch.setattr(sys, "stdin", io.StringIO(f"{HELD}\n"))
            code, _, err = cli(f"saga cancel {WHERE} --reason 'bank holiday'")
            assert code == 2
            assert err == (
                f"saga-processor: {HELD} sagas match, more than --confirm-over 20: add --yes to "
                "go on (--dry-run lists them)\n"
            )
            assert db("SELECT count(*) FROM operator_audit") == [(0,)]
            assert db("SELECT count(*) FROM saga_history WHERE kind = 'operator'") == [(0,)]

            started = time.monotonic()
            code, out, err = cli(f"saga cancel {WHERE} --reason 'bank holiday' --yes")
            assert (code, err) == (0, ""), out
            lines = out.splitlines()
            assert lines[:2] == [f"sent 100 of {HELD}", f"sent {HELD} of {HELD}"]
            assert f"applied {HELD} of {HELD}" in lines
            summary = rf"batch ([0-9a-f]{{32}}): cancel of {HELD} sagas: {HELD} applied"
            found = re.fullmatch(summary, lines[-1])
            assert found is not None, lines[-1]
            batch = found.group(1)
            assert time.monotonic() - started < 30

            reversals = _reversals(commands, HELD)
            wait_until(lambda: db(shape) == [(0, 3, 2 + HELD)], 30, "the cancelled transfers")
        # Each debit reversed exactly once, and none of the others.
        assert reversals == Counter(dict.fromkeys(held, 1))
        operator_rows = "SELECT saga_id FROM saga_history WHERE kind = 'operator' ORDER BY saga_id"
        assert [r[0] for r in db(operator_rows)] == held
        untouched = "SELECT saga_id, status, version FROM saga_instance WHERE saga_id = ANY(%s)"
        assert sorted(db(untouched, confirmed + failed)) == sorted(
            [(t, "active", 2) for t in confirmed] + [(t, "ended", 2) for t in failed]
        )

        code, out, _ = cli(f"audit list --batch {batch} --limit 1000 --json")
        assert code == 0
        entries = json.loads(out)
        [own] = [e for e in entries if e["action"] == "batch-cancel"]
        assert (own["outcome"], own["reason"]) == ("sent", "bank holiday")
        assert own["actor"] == "batch-operator"
        assert own["target"] == {
            "batch": batch,
            "where": {"type": "transfer-saga", "attr": "debit_confirmed=false"},
            "matched": HELD,
        }
        per_saga = [e for e in entries if e is not own]
        assert sorted(e["saga_id"] for e in per_saga) == held
        assert {(e["action"], e["outcome"], e["target"]["batch"]) for e in per_saga} == {
            ("cancel", "applied", batch)
        }
    finally:
        commands.close()


def _cli(settings: ProcessorSettings, mp: pytest.MonkeyPatch, line: str) -> int:
    """Runs ``saga-processor LINE`` as a user would, with the processor's settings."""
    for name, value in settings_env(settings).items():
        mp.setenv(name, value)
    return main(shlex.split(line))


def _requested(tid: str) -> TransferRequested:
    return TransferRequested(
        transfer_id=tid, source_account_id="A", target_account_id="B", amount=Decimal("10.00")
    )


def _reversals(commands: Reader, expected: int) -> Counter[str]:
    """ReverseDebit commands per transfer, once ``expected`` came and 1.5 s brought no more."""

    def count() -> Counter[str]:
        return Counter(
            json.loads(m.value())["transfer_id"]
            for m in commands.records
            if commands.headers(m)["message-type"] == "transfers.ReverseDebit"
        )

    commands.wait_for(lambda _: sum(count().values()) >= expected, what="the reversals")
    # A duplicate would follow its first copy closely: the relay publishes in order per saga.
    quiet = time.monotonic() + 1.5
    while time.monotonic() < quiet:
        commands.poll()
    return count()
