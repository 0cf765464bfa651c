"""Settings from SAGA_* variables: the deadline specification's names and defaults, required
values, and misspelt names."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path

import pytest

from processor._bootstrap.participant import participant_buckets
from processor._errors import ConfigurationError
from processor.settings import load_settings, unknown_variables


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Whatever the developer's shell exports must not leak into the defaults under test.
    for name in list(os.environ):
        if name.startswith("SAGA_") and not name.startswith("SAGA_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SAGA_DATABASE__URL", "postgresql://saga@127.0.0.1/saga")


def test_defaults_match_the_specification() -> None:
    deadline = load_settings().deadline
    assert deadline.enabled is True
    assert deadline.polling.interval == timedelta(seconds=30)
    assert deadline.polling.batch_size == 100
    assert deadline.lease_ttl == timedelta(minutes=2)
    assert deadline.schema_.auto is True
    assert (deadline.table, deadline.lock_table) == ("saga_deadline", "saga_deadline_lock")


def test_every_deadline_setting_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SAGA_DEADLINE__ENABLED", "false")
    monkeypatch.setenv("SAGA_DEADLINE__POLLING__INTERVAL", "5s")
    monkeypatch.setenv("SAGA_DEADLINE__POLLING__BATCH_SIZE", "7")
    monkeypatch.setenv("SAGA_DEADLINE__LEASE_TTL", "2m")
    monkeypatch.setenv("SAGA_DEADLINE__SCHEMA__AUTO", "false")
    monkeypatch.setenv("SAGA_DEADLINE__TABLE", "my_deadline")
    monkeypatch.setenv("SAGA_DEADLINE__LOCK_TABLE", "my_deadline_lock")
    deadline = load_settings().deadline
    assert deadline.enabled is False
    assert deadline.polling.interval == timedelta(seconds=5)
    assert deadline.polling.batch_size == 7
    assert deadline.lease_ttl == timedelta(minutes=2)
    assert deadline.schema_.auto is False
    assert (deadline.table, deadline.lock_table) == ("my_deadline", "my_deadline_lock")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("2m", timedelta(minutes=2)),
        ("250ms", timedelta(milliseconds=250)),
        ("1.5h", timedelta(minutes=90)),
        ("45", timedelta(seconds=45)),
        ("PT40S", timedelta(seconds=40)),
    ],
)
def test_durations_accept_units(
    monkeypatch: pytest.MonkeyPatch, text: str, expected: timedelta
) -> None:
    monkeypatch.setenv("SAGA_DEADLINE__POLLING__INTERVAL", text)
    monkeypatch.setenv("SAGA_DEADLINE__LEASE_TTL", "1d")
    assert load_settings().deadline.polling.interval == expected


@pytest.mark.parametrize(("interval", "ttl"), [("30s", "30s"), ("2m", "90s"), ("1m", "59s")])
def test_lease_ttl_must_exceed_the_polling_interval(
    monkeypatch: pytest.MonkeyPatch, interval: str, ttl: str
) -> None:
    monkeypatch.setenv("SAGA_DEADLINE__POLLING__INTERVAL", interval)
    monkeypatch.setenv("SAGA_DEADLINE__LEASE_TTL", ttl)
    with pytest.raises(ConfigurationError) as raised:
        load_settings()
    message = str(raised.value)
    assert "SAGA_DEADLINE" in message
    assert "lease-ttl" in message
    assert "polling.interval" in message


def test_a_lease_just_longer_than_the_interval_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGA_DEADLINE__POLLING__INTERVAL", "30s")
    monkeypatch.setenv("SAGA_DEADLINE__LEASE_TTL", "31s")
    assert load_settings().deadline.lease_ttl == timedelta(seconds=31)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SAGA_DEADLINE__POLLING__INTERVAL", "soon"),
        ("SAGA_DEADLINE__POLLING__BATCH_SIZE", "0"),
        ("SAGA_DEADLINE__TABLE", "Robert'); DROP TABLE x;--"),
    ],
)
def test_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as raised:
        load_settings()
    assert name in str(raised.value)


def test_the_database_url_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAGA_DATABASE__URL")
    with pytest.raises(ConfigurationError) as raised:
        load_settings()
    assert "SAGA_DATABASE__URL: required" in str(raised.value)


def test_no_saga_runs_by_default() -> None:
    assert load_settings().sagas == []


def test_a_misspelt_variable_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGA_DEADLINE__POLLING__INTERVALL", "5s")
    monkeypatch.setenv("SAGA_CONSUMER_GROUP_ID", "g")  # one underscore: not nested
    with pytest.raises(ConfigurationError) as raised:
        load_settings()
    message = str(raised.value)
    assert "SAGA_DEADLINE__POLLING__INTERVALL" in message
    assert "SAGA_CONSUMER_GROUP_ID" in message
    assert len(raised.value.problems) == 2


@pytest.mark.parametrize(
    "name",
    [
        "SAGA_DATABASE__URL",
        "SAGA_DEADLINE__SCHEMA__AUTO",
        "SAGA_DEADLINE__POLLING",
        "SAGA_KAFKA__CONFIG__SECURITY.PROTOCOL",
        "SAGA_SETTINGS__TRANSFER.PAYMENT-TIMEOUT",
        "SAGA_CONSUMER",
        "SAGA_TEST_ANYTHING",
        "SAGA_FAULT_POINT",
        "SAGA_CACHE_DIR",
        "SAGA_PG_PORT",
        "SAGA_KAFKA_PORT",
        "PATH",
    ],
)
def test_settings_and_tool_variables_are_known(name: str) -> None:
    assert unknown_variables({name: "x"}) == []


def test_every_variable_the_local_stack_reads_is_known() -> None:
    # The test run passes its environment to the processes it starts: a stack variable the
    # processor refused would stop every one of them.
    scripts = (Path(__file__).resolve().parents[2] / "deploy" / "local").glob("*.sh")
    names = {n for script in scripts for n in re.findall(r"SAGA_[A-Z_]+", script.read_text())}
    assert "SAGA_LOCAL_PG_FSYNC" in names
    assert unknown_variables(dict.fromkeys(names, "x")) == []


@pytest.mark.parametrize(
    "name",
    ["SAGA_SAGA", "SAGA_DATABASE__URI", "SAGA_DEADLINE__SCHEMA__AUTO__X", "SAGA_RELAY__ENABLE"],
)
def test_misspelt_names_are_unknown(name: str) -> None:
    assert unknown_variables({name: "x", "SAGA_SAGAS": "[]"}) == [name]


def test_operator_records_expire_after_15_minutes_unless_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().operator.expiry == timedelta(minutes=15)
    monkeypatch.setenv("SAGA_OPERATOR__EXPIRY", "5m")
    assert load_settings().operator.expiry == timedelta(minutes=5)
    monkeypatch.setenv("SAGA_OPERATOR__EXPIRY", "0s")
    with pytest.raises(ConfigurationError) as raised:
        load_settings()
    assert "SAGA_OPERATOR__EXPIRY" in str(raised.value)


def test_a_participant_schema_takes_its_own_bucket_count_else_the_processors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert participant_buckets(load_settings()) is None
    monkeypatch.setenv("SAGA_DATABASE__BUCKETS", "6")
    assert participant_buckets(load_settings()) == 6
    # Its command topics have another count than the processor's input topics.
    monkeypatch.setenv("SAGA_PARTICIPANT__BUCKETS", "4")
    assert participant_buckets(load_settings()) == 4
    monkeypatch.setenv("SAGA_PARTICIPANT__BUCKETS", "0")
    with pytest.raises(ConfigurationError, match="SAGA_PARTICIPANT__BUCKETS"):
        load_settings()
