"""Where the tests find a Schema Registry, and who may stop and start it."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import pytest

import devstack

URL = "http://127.0.0.1:18081/apis/ccompat/v7"


def fake_scripts(
    monkeypatch: pytest.MonkeyPatch, running: list[bool]
) -> list[tuple[str, dict[str, str] | None]]:
    """registry.sh as a fake: `up` and `down` flip `running[0]`; returns the actions run."""
    calls: list[tuple[str, dict[str, str] | None]] = []

    def script(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        action = command[-1]
        calls.append((action, kwargs.get("env")))
        if action == "status":
            return subprocess.CompletedProcess(command, 0 if running[0] else 3)
        if action in ("up", "down"):
            running[0] = action == "up"
        return subprocess.CompletedProcess(command, 0, stdout=URL + "\n")

    def run(command: list[str], echo: Callable[[str], None], **kwargs: Any) -> None:
        script(command, **kwargs)

    monkeypatch.setattr(subprocess, "run", script)
    monkeypatch.setattr(devstack, "_run", run)
    return calls


def test_a_given_registry_comes_without_controls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(devstack.ENV_SCHEMA_REGISTRY, URL)
    monkeypatch.delenv(devstack.ENV_ALLOW_REGISTRY_RESTART, raising=False)
    calls = fake_scripts(monkeypatch, [True])
    with devstack.provide_registry(echo=lambda _: None) as registry:
        assert registry.url == URL
        assert registry.stop is None
        assert registry.start is None
    assert [a for a, _ in calls if a != "status"] == []


def test_the_runs_registry_restarts_without_the_test_runs_mark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # tests/run.py ends every process carrying the mark when a phase ends: a registry started
    # again by a test of that phase would go with it, and the next phase would find none.
    monkeypatch.setenv(devstack.ENV_SCHEMA_REGISTRY, URL)
    monkeypatch.setenv(devstack.ENV_ALLOW_REGISTRY_RESTART, "1")
    monkeypatch.setenv(devstack.TEST_RUN_MARK, "phase-2")
    calls = fake_scripts(monkeypatch, [True])
    with devstack.provide_registry(echo=lambda _: None) as registry:
        assert registry.stop is not None
        assert registry.start is not None
        registry.stop()
        registry.start()
    # Left running at the end: the run that started it stops it.
    actions = [(a, env) for a, env in calls if a != "status"]
    assert [a for a, _ in actions] == ["down", "up"]
    env = actions[1][1]
    assert env is not None
    assert devstack.TEST_RUN_MARK not in env


def test_a_registry_started_here_keeps_the_mark_and_stops_on_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Should the pytest that started it be killed, tests/run.py ends it with the rest.
    monkeypatch.delenv(devstack.ENV_SCHEMA_REGISTRY, raising=False)
    monkeypatch.setenv(devstack.TEST_RUN_MARK, "phase-1")
    running = [False]
    calls = fake_scripts(monkeypatch, running)
    with devstack.provide_registry(echo=lambda _: None) as registry:
        assert registry.url == URL
        assert running == [True]
        assert registry.stop is not None
        assert registry.start is not None
        registry.stop()
        registry.start()
    assert running == [False]
    actions = [(a, env) for a, env in calls if a not in ("status", "url")]
    assert [a for a, _ in actions] == ["up", "down", "up", "down"]
    for action, env in actions:
        if action == "up":
            assert env is not None
            assert env[devstack.TEST_RUN_MARK] == "phase-1"


def test_a_registry_that_ran_before_is_used_and_left_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(devstack.ENV_SCHEMA_REGISTRY, raising=False)
    running = [True]
    calls = fake_scripts(monkeypatch, running)
    with devstack.provide_registry(echo=lambda _: None) as registry:
        assert registry.stop is None
        assert registry.start is None
    assert running == [True]
    assert "down" not in [a for a, _ in calls]
