"""Deploys that change a saga's state or an event's schema while sagas are in flight.

- 200 sagas run on state v1; the processor is replaced by code at v2 (a field renamed, one
  removed, one added with a computed value) with an upcaster; every saga finishes on v2 with the
  right values, and none is parked.
- The same deploy without the upcaster: `check` fails, naming the saga type and the stored
  version, and nothing is processed.
- An event at schema-version 2 reaches code that knows only version 1: the saga is parked with
  it (and what follows waits behind it); once code that knows v2 runs, a retry applies them in
  order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from pydantic import Field

from processor import (
    Message,
    SagaCommands,
    SagaState,
    message_type,
    saga,
    saga_event_handler,
    upcaster,
)
from processor._authoring.upcasting import state_upcasters
from processor._cli.preflight import check_from_settings
from processor.settings import ProcessorSettings
from tests.support.harness import (
    Publisher,
    Reader,
    create_topics,
    query,
    running,
    settings_for,
    wait_until,
)
from tests.support.procs import REPO, settings_env

pytestmark = pytest.mark.integration

EVENTS = "upcast-test-events"
COMMANDS = "upcast-test-commands"
ACCOUNT = "upcast-test-account"
NO_UPCASTER = "upcast-test-no-upcaster"
NOTES = "upcast-test-notes"
SAGAS = 200


@message_type("tests.upcast.Opened", topic=EVENTS)
class Opened(Message):
    account_id: str
    amount: Decimal


@message_type("tests.upcast.Deposited", topic=EVENTS)
class Deposited(Message):
    account_id: str
    amount: Decimal


@message_type("tests.upcast.Closed", topic=EVENTS)
class Closed(Message):
    account_id: str


@message_type("tests.upcast.Statement", topic=COMMANDS)
class Statement(Message):
    account_id: str
    balance: Decimal
    balance_minor: int
    deposits: int


# -- state v1 and v2 of one saga type ------------------------------------------------------------


class _AccountV1(SagaState):
    account: str = ""
    balance: Decimal = Decimal(0)
    legacy_flag: bool = False
    deposits: int = 0

    @saga_event_handler(Opened, association_property="account_id", start=True)
    def opened(self, event: Opened) -> None:
        self.account = event.account_id
        self.balance = event.amount
        self.legacy_flag = True

    @saga_event_handler(Deposited, association_property="account_id")
    def deposited(self, event: Deposited) -> None:
        self.balance += event.amount
        self.deposits += 1


class _AccountV2(SagaState):
    account_id: str = ""  # was `account`
    balance: Decimal = Decimal(0)
    balance_minor: int = 0  # new: the balance in cents
    deposits: int = 0  # `legacy_flag` is gone

    @saga_event_handler(Opened, association_property="account_id", start=True)
    def opened(self, event: Opened) -> None:
        self.account_id = event.account_id
        self.balance = event.amount
        self.balance_minor = int(event.amount * 100)

    @saga_event_handler(Deposited, association_property="account_id")
    def deposited(self, event: Deposited) -> None:
        self.balance += event.amount
        self.balance_minor += int(event.amount * 100)
        self.deposits += 1

    @saga_event_handler(Closed, association_property="account_id", end=True)
    def closed(self, event: Closed, commands: SagaCommands) -> None:
        commands.send(
            Statement(
                account_id=self.account_id,
                balance=self.balance,
                balance_minor=self.balance_minor,
                deposits=self.deposits,
            )
        )


AccountV1 = saga(type=ACCOUNT)(type("AccountV1", (_AccountV1,), {}))
AccountV2 = saga(type=ACCOUNT, version=2)(type("AccountV2", (_AccountV2,), {}))
# The same change, for a type whose deploy forgets the upcaster.
NoUpcasterV1 = saga(type=NO_UPCASTER)(type("NoUpcasterV1", (_AccountV1,), {}))
NoUpcasterV2 = saga(type=NO_UPCASTER, version=2)(type("NoUpcasterV2", (_AccountV2,), {}))


# The same change again, for the rolling deploy (its upcaster is registered by that test).
ROLLING = "upcast-test-rolling"
RollingV1 = saga(type=ROLLING)(type("RollingV1", (_AccountV1,), {}))
RollingV2 = saga(type=ROLLING, version=2)(type("RollingV2", (_AccountV2,), {}))


def account_v1_to_v2(state: dict[str, Any]) -> dict[str, Any]:
    """Renames `account`, drops `legacy_flag`, computes `balance_minor` from the balance."""
    state["account_id"] = state.pop("account")
    state.pop("legacy_flag")
    state["balance_minor"] = int(Decimal(state["balance"]) * 100)
    return state


# -- an event whose schema moves to v2 ---------------------------------------------------------


class NotedV1(Message):
    account_id: str
    text: str


class NotedV2(Message):
    account_id: str
    lines: list[str]


NOTED = "tests.upcast.Noted"
message_type(NOTED, topic=EVENTS)(NotedV1)
# NotedV2 is registered by the test, as the deploy of the code that knows it.


class _Journal(SagaState):
    account_id: str = ""
    entries: list[str] = Field(default_factory=list)

    @saga_event_handler(Opened, association_property="account_id", start=True)
    def opened(self, event: Opened) -> None:
        self.account_id = event.account_id
        self.entries.append("opened")


class _JournalV1(_Journal):
    @saga_event_handler(NotedV1, association_property="account_id")
    def noted(self, event: NotedV1) -> None:
        self.entries.append(event.text)


class _JournalV2(_Journal):
    @saga_event_handler(NotedV1, association_property="account_id")
    def noted(self, event: NotedV1) -> None:
        self.entries.append(event.text)

    @saga_event_handler(NotedV2, association_property="account_id")
    def noted2(self, event: NotedV2) -> None:
        self.entries.append("+".join(event.lines))


# The saga classes are declared when used: NotedV2 must be registered before JournalV2 binds.
JOURNAL = "upcast-test-journal"


@dataclass
class Env:
    settings: ProcessorSettings
    pub: Publisher
    kafka: str

    @property
    def events(self) -> str:
        return self.settings.topic_prefix + EVENTS

    def db(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        url = self.settings.database.url.get_secret_value()
        return query(url, self.settings.database.schema_name, sql, *args)

    def count(self, sql: str, *args: object) -> int:
        return int(self.db(sql, *args)[0][0])


@pytest.fixture
def env(kafka_bootstrap: str, database_url: str, pg_schema: str) -> Env:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    create_topics(
        kafka_bootstrap,
        [prefix + EVENTS, prefix + COMMANDS, prefix + "saga-dead-letters"],
        partitions=3,
    )
    settings = settings_for(kafka_bootstrap, database_url, pg_schema, prefix)
    return Env(settings, Publisher(kafka_bootstrap), kafka_bootstrap)


def _start_v1_sagas(env: Env, saga_cls: type[Any], ids: list[str]) -> None:
    """Runs the v1 code until every saga has its two events applied, then stops it."""
    with running(env.settings, [saga_cls]):
        for i, account in enumerate(ids):
            env.pub.event(env.events, account, Opened(account_id=account, amount=Decimal(i)))
        for account in ids:
            env.pub.event(
                env.events, account, Deposited(account_id=account, amount=Decimal("0.50"))
            )
        env.pub.flush()
        wait_until(
            lambda: env.count("SELECT count(*) FROM saga_instance WHERE version = 2") == len(ids),
            timeout=120,
            what="every v1 saga at its second event",
        )
    assert env.count("SELECT count(*) FROM saga_instance WHERE state_version <> 1") == 0


def test_in_flight_sagas_finish_on_the_new_state_version_through_an_upcaster(env: Env) -> None:
    ids = [f"a-{i:03d}-{uuid.uuid4().hex[:4]}" for i in range(SAGAS)]
    _start_v1_sagas(env, AccountV1, ids)

    # The deploy: v2 code with its upcaster; the preflight passes before it runs.
    upcaster(ACCOUNT, from_version=1)(account_v1_to_v2)
    report = check_from_settings(env.settings, [AccountV2])
    assert report.ok, report.render()
    assert report.counts["unended sagas"] == SAGAS
    assert any(f"{SAGAS} saga(s) stored at state v1" in n for n in report.notes)

    statements = Reader(env.kafka, [env.settings.topic_prefix + COMMANDS])
    try:
        with running(env.settings, [AccountV2]):
            for account in ids:
                env.pub.event(env.events, account, Deposited(account_id=account, amount=Decimal(1)))
                env.pub.event(env.events, account, Closed(account_id=account))
            env.pub.flush()
            statements.wait_for(lambda rs: len(rs) >= SAGAS, timeout=180, what="statements")
        got = {
            body["account_id"]: body for body in (json.loads(m.value()) for m in statements.records)
        }
    finally:
        statements.close()
    assert len(got) == SAGAS
    for i, account in enumerate(ids):
        balance = Decimal(i) + Decimal("1.50")
        assert got[account] == {
            "account_id": account,
            "balance": str(balance),
            "balance_minor": int(balance * 100),
            "deposits": 2,
        }
    assert env.db("SELECT status, state_version, count(*) FROM saga_instance GROUP BY 1, 2") == [
        ("ended", 2, SAGAS)
    ]
    assert env.count("SELECT count(*) FROM parked_message") == 0
    assert env.count("SELECT count(*) FROM saga_history WHERE outcome <> 'applied'") == 0


def test_check_fails_before_a_deploy_that_lacks_the_upcaster(env: Env) -> None:
    ids = [f"n-{i}-{uuid.uuid4().hex[:4]}" for i in range(5)]
    _start_v1_sagas(env, NoUpcasterV1, ids)
    history = env.count("SELECT count(*) FROM saga_history")

    report = check_from_settings(env.settings, [NoUpcasterV2])
    assert not report.ok
    [problem] = report.problems
    assert f"saga {NO_UPCASTER!r} state v1: 5 unended saga(s) cannot run" in problem
    assert f"no upcaster from v1; register @upcaster({NO_UPCASTER!r}, from_version=1)" in problem

    # The same from the command line, as a deploy pipeline runs it: exit code 1.
    done = _cli(env, "tests.integration.test_upcasting:NoUpcasterV2", "check")
    assert done.returncode == 1, done.stderr
    assert f"PROBLEM: saga {NO_UPCASTER!r} state v1" in done.stdout
    assert "check FAILED: 1 problem(s)" in done.stdout
    # Nothing was processed or written.
    assert env.count("SELECT count(*) FROM saga_history") == history
    assert env.count("SELECT count(*) FROM saga_instance WHERE version = 2") == len(ids)


def test_check_reports_missing_topics_and_migrate_sql_prints_nothing_when_current(
    env: Env,
) -> None:
    settings = env.settings.model_copy(update={"topic_prefix": "no-such-prefix."})
    with running(env.settings, [NoUpcasterV1]):
        pass  # migrates the schema
    report = check_from_settings(settings, [NoUpcasterV1])
    assert any("topic 'no-such-prefix.upcast-test-events'" in p for p in report.problems)
    done = _cli(env, "tests.integration.test_upcasting:NoUpcasterV1", "migrate", "--sql")
    assert done.returncode == 0, done.stderr
    assert "nothing to apply" in done.stdout


def test_migrate_sql_prints_the_pending_ddl_without_applying_it(env: Env) -> None:
    done = _cli(env, "tests.integration.test_upcasting:NoUpcasterV1", "migrate", "--sql")
    assert done.returncode == 0, done.stderr
    assert "is at migration 0" in done.stdout
    assert "CREATE TABLE" in done.stdout
    assert "ADD COLUMN state_version" in done.stdout
    assert (
        env.count(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
            env.settings.database.schema_name,
        )
        == 0
    )


def test_an_event_newer_than_the_code_parks_its_saga_until_the_new_code_replays_it(
    env: Env,
) -> None:
    journal_v1 = saga(type=JOURNAL)(type("JournalV1", (_JournalV1,), {}))
    account, other = f"j-{uuid.uuid4().hex[:6]}", f"k-{uuid.uuid4().hex[:6]}"
    newer = {"account_id": account, "lines": ["two", "lines"]}
    state_of = "SELECT state FROM saga_instance WHERE saga_id = %s"
    with running(env.settings, [journal_v1]):
        for a in (account, other):
            env.pub.event(env.events, a, Opened(account_id=a, amount=Decimal(1)))
        env.pub.event(env.events, account, NotedV1(account_id=account, text="first"))
        # A producer deployed before the processor: schema-version 2, unknown to this code.
        env.pub.raw(
            env.events,
            account.encode(),
            json.dumps(newer).encode(),
            [
                ("message-id", b"m-newer"),
                ("message-type", NOTED.encode()),
                ("schema-version", b"2"),
            ],
        )
        env.pub.event(env.events, account, NotedV1(account_id=account, text="last"))
        env.pub.event(env.events, other, NotedV1(account_id=other, text="unaffected"))
        env.pub.flush()
        wait_until(
            lambda: (
                env.count("SELECT count(*) FROM parked_message WHERE saga_id = %s", account) == 2
            ),
            timeout=90,
            what="the newer event and the one after it held",
        )
        # The other saga is on a partition of its own, which may not have started it yet.
        wait_until(
            lambda: (
                [row[0]["entries"] for row in env.db(state_of, other)] == [["opened", "unaffected"]]
            ),
            what="the other saga flows",
        )
    held = env.db(
        "SELECT headers->>'schema-version', reason FROM parked_message WHERE saga_id = %s "
        "ORDER BY id",
        account,
    )
    assert held[0][0] == "2"
    assert "schema-version 2 is newer than this code knows (v1)" in held[0][1]
    assert held[1] == ("1", "behind a parked saga")
    assert env.count("SELECT count(*) FROM dead_letter") == 0

    # The deploy of the code that knows v2; its preflight says the held messages now decode.
    message_type(NOTED, version=2, topic=EVENTS)(NotedV2)
    journal_v2 = saga(type=JOURNAL)(type("JournalV2", (_JournalV2,), {}))
    report = check_from_settings(env.settings, [journal_v2])
    assert report.ok, report.render()
    assert any("decode with this code" in n for n in report.notes)
    # Starting the new code is all it takes: the held events go on, in order.
    with running(env.settings, [journal_v2]):
        wait_until(
            lambda: (
                env.db("SELECT status FROM saga_instance WHERE saga_id = %s", account)[0][0]
                == "active"
            ),
            timeout=60,
            what="the held saga going on after the deploy",
        )
    state = env.db("SELECT status, state FROM saga_instance WHERE saga_id = %s", account)
    assert state[0][0] == "active"
    assert state[0][1]["entries"] == ["opened", "first", "two+lines", "last"]


def _cli(env: Env, target: str, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        **settings_env(env.settings),
        "SAGA_SAGAS": json.dumps([target]),
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run(
        [sys.executable, "-m", "processor", *args],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


ROLLING_SAGAS = 30


def test_a_rolling_deploy_leaves_no_saga_parked(env: Env) -> None:
    """Old and new pods run together while a state version goes from v1 to v2.

    An old pod that reads a row the new code wrote parks that saga ("stored state is v2, newer
    than this code's v1"); a new pod resumes it by itself, and once the rollout is done none
    is left parked and no deposit is lost or applied twice.
    """
    ids = [f"r-{i:03d}-{uuid.uuid4().hex[:4]}" for i in range(ROLLING_SAGAS)]
    _start_v1_sagas(env, RollingV1, ids)
    upcaster(ROLLING, from_version=1)(account_v1_to_v2)
    s = env.settings

    def pod(name: str) -> ProcessorSettings:
        return settings_for(
            env.kafka,
            s.database.url.get_secret_value(),
            s.database.schema_name,
            s.topic_prefix,
            instance_id=name,
            consumer={"resume_interval": "1s"},
        )

    def deposit_all() -> None:
        for account in ids:
            env.pub.event(env.events, account, Deposited(account_id=account, amount=Decimal(1)))
        env.pub.flush()

    def deposit_round(n: int) -> None:
        deposit_all()
        wait_until(
            lambda: (
                env.count(
                    "SELECT count(*) FROM saga_instance WHERE version >= %s OR status = 'parked'",
                    n,
                )
                == ROLLING_SAGAS
            ),
            timeout=120,
            what=f"deposit round {n} applied or held",
        )

    # A new pod alone writes every saga at v2; then an old pod alone meets those rows.
    with running(pod("new-1"), [RollingV2]):
        deposit_round(3)
    assert env.count("SELECT count(*) FROM saga_instance WHERE state_version = 2") == ROLLING_SAGAS
    # The old release has no upcaster to v2 (its binding would refuse one past its version).
    state_upcasters.remove(ROLLING, 1)
    with running(pod("old-1"), [RollingV1]):
        deposit_all()
        wait_until(
            lambda: (
                env.count("SELECT count(*) FROM saga_instance WHERE status = 'parked'")
                == ROLLING_SAGAS
            ),
            timeout=120,
            what="the old pod parking every saga the new code wrote",
        )
        reasons = env.db("SELECT DISTINCT parked_reason FROM saga_instance")
        assert [r for (r,) in reasons if "stored state is v2, newer than this code's v1" in r]
        # One pod of each, under load: the new one resumes what the old one parks.
        upcaster(ROLLING, from_version=1)(account_v1_to_v2)
        with running(pod("new-2"), [RollingV2]):
            deposit_all()
            wait_until(
                lambda: (
                    env.count(
                        "SELECT count(*) FROM saga_instance "
                        "WHERE status = 'active' AND (state->>'deposits')::int >= 3"
                    )
                    > 0
                ),
                timeout=60,
                what="the new pod resuming sagas while the old one runs",
            )
    # The old pod is gone: the rollout is done.
    with running(pod("new-3"), [RollingV2]):
        wait_until(
            lambda: (
                env.count(
                    "SELECT count(*) FROM saga_instance "
                    "WHERE status = 'active' AND (state->>'deposits')::int = 4"
                )
                == ROLLING_SAGAS
            ),
            timeout=120,
            what="every saga resumed with all four deposits",
        )
    assert env.count("SELECT count(*) FROM saga_instance WHERE status = 'parked'") == 0
    assert env.count("SELECT count(*) FROM parked_message") == 0
    rows = env.db("SELECT saga_id, state->>'balance' FROM saga_instance")
    assert {a: Decimal(b) for a, b in rows} == {
        a: Decimal(i) + Decimal("3.50") for i, a in enumerate(ids)
    }
