"""A broker a test restarts belongs to the stack, not to the test run's processes."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

import devstack


def test_a_restarted_broker_does_not_carry_the_test_runs_mark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # tests/run.py ends every process carrying the mark when a phase ends: a broker restarted
    # by a test of that phase would go with it, and the next phase would find none.
    monkeypatch.setenv(devstack.TEST_RUN_MARK, "phase-2")
    calls: list[tuple[list[str], dict[str, str] | None]] = []

    def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append((command, kwargs.get("env")))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", run)
    devstack._restart_local_kafka()

    (down, _), (up, env) = calls
    assert down[-1] == "down"
    assert up[-1] == "up"
    assert env is not None
    assert devstack.TEST_RUN_MARK not in env
