"""Where the citus phase finds a coordinator: the given URL, the local cluster, containers."""

from __future__ import annotations

import subprocess
from contextlib import ExitStack
from typing import Any

import pytest

import devstack


def no_local_citus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(devstack.ENV_CITUS, raising=False)

    def status(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        assert command[-1] == "status"
        return subprocess.CompletedProcess(command, devstack._CITUS_MISSING)

    monkeypatch.setattr(subprocess, "run", status)


def test_without_citus_or_docker_the_phase_is_told_both_are_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_local_citus(monkeypatch)
    monkeypatch.setattr(devstack, "_docker_answers", lambda: False)
    with devstack.provide_citus(echo=lambda _: None) as citus:
        assert citus.url is None
        assert "not installed" in citus.reason
        assert "no Docker engine answers" in citus.reason
        assert devstack.ENV_CITUS in citus.reason


def test_with_a_docker_engine_the_containers_serve_and_stop_with_the_phase(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_local_citus(monkeypatch)
    monkeypatch.setattr(devstack, "_docker_answers", lambda: True)
    stopped: list[str] = []

    def containers(cleanup: ExitStack, echo: Any) -> str:
        cleanup.callback(stopped.append, "cluster")
        return "postgresql://saga:saga@127.0.0.1:32768/saga"

    monkeypatch.setattr(devstack, "_citus_containers", containers)
    with devstack.provide_citus(echo=lambda _: None) as citus:
        assert citus.url == "postgresql://saga:saga@127.0.0.1:32768/saga"
        assert stopped == []
    assert stopped == ["cluster"]


def test_an_image_that_does_not_come_up_skips_the_phase_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_local_citus(monkeypatch)
    monkeypatch.setattr(devstack, "_docker_answers", lambda: True)
    monkeypatch.setattr(devstack, "_citus_containers", lambda cleanup, echo: None)
    with devstack.provide_citus(echo=lambda _: None) as citus:
        assert citus.url is None
        assert "could not start the Citus image" in citus.reason
