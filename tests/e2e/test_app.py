"""`saga-processor run MODULE:ATTR`: an application object with dependencies, from the CLI.

The app (tests/e2e/gated_app.py) builds a `Gate` with a factory that writes a marker file when
it is closed. Its settings name a topic prefix that the environment overrides: the processor
only sees the test's topics when the environment wins.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import E2EEnv, log_lines
from tests.e2e.gated_app import EVENTS, NEEDY_TYPE, SAGA_TYPE, JobRequested
from tests.support.harness import Publisher, create_topics, wait_until
from tests.support.procs import REPO, ProcessorProcess, settings_env

pytestmark = [pytest.mark.e2e]

APP = "tests.e2e.gated_app:app"


def _env(e2e_env: E2EEnv, tmp: Path) -> dict[str, str]:
    environ = {**os.environ, **settings_env(e2e_env.settings()), "GATED_APP_DIR": str(tmp)}
    environ.pop("SAGA_SAGAS", None)  # the app names the sagas
    environ["PYTHONPATH"] = str(REPO)
    return environ


def _cli(environ: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "processor", *args],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _status(e2e_env: E2EEnv, job: str) -> Any:
    rows = e2e_env.query(
        "SELECT status FROM saga_instance WHERE saga_type = %s AND saga_id = %s", SAGA_TYPE, job
    )
    return rows[0][0] if rows else None


def _start(e2e_env: E2EEnv, environ: dict[str, str], name: str) -> subprocess.Popen[bytes]:
    log = open(e2e_env.logs / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen(
        [sys.executable, "-m", "processor", "run", APP],
        cwd=REPO,
        env={**environ, "SAGA_INSTANCE_ID": name},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    return proc


def _log(e2e_env: E2EEnv, name: str) -> str:
    return (e2e_env.logs / f"{name}.log").read_text(errors="replace")


def test_an_app_runs_from_the_cli_and_a_parked_saga_is_retried_after_the_fix(
    e2e_env: E2EEnv, tmp_path: Path
) -> None:
    create_topics(e2e_env.kafka, [e2e_env.prefix + EVENTS])
    environ = _env(e2e_env, tmp_path)
    gate = tmp_path / "gate"
    gate.write_text("open\n")
    proc = _start(e2e_env, environ, "app-run")
    try:
        passing, blocked = f"job-{uuid.uuid4().hex[:6]}", f"job-{uuid.uuid4().hex[:6]}"
        pub = Publisher(e2e_env.kafka)
        pub.event(e2e_env.prefix + EVENTS, passing, JobRequested(job_id=passing))
        pub.flush()
        wait_until(
            lambda: _status(e2e_env, passing) == "ended" or proc.poll() is not None,
            timeout=120,
            what="the first job to pass the open gate",
        )
        assert _status(e2e_env, passing) == "ended", _log(e2e_env, "app-run")

        gate.write_text("closed\n")
        pub.event(e2e_env.prefix + EVENTS, blocked, JobRequested(job_id=blocked))
        pub.flush()
        wait_until(lambda: _status(e2e_env, blocked) == "parked", timeout=120, what="parked")

        # Still closed: the retry fails again and the saga stays parked.
        again = _cli(environ, "retry", SAGA_TYPE, blocked, "--app", APP)
        assert again.returncode == 1, again.stdout + again.stderr
        assert "gate is closed" in again.stderr
        assert _status(e2e_env, blocked) == "parked"

        # The fix: the dependency lets it through now. The retry takes the app from SAGA_APP.
        gate.write_text("open\n")
        retried = _cli({**environ, "SAGA_APP": APP}, "retry", SAGA_TYPE, blocked)
        assert retried.returncode == 0, retried.stdout + retried.stderr
        assert "now ended" in retried.stdout
        assert _status(e2e_env, blocked) == "ended"
    finally:
        proc.terminate()
        proc.wait(60)
    assert proc.returncode == 0, _log(e2e_env, "app-run")


def test_a_handler_parameter_nothing_provides_fails_at_startup(
    e2e_env: E2EEnv, tmp_path: Path
) -> None:
    result = _cli(_env(e2e_env, tmp_path), "run", "tests.e2e.gated_app:broken_app")
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        f"saga {NEEDY_TYPE!r}: handler audited: parameter 'audit' needs a dependency of type "
        "AuditLog" in result.stderr
    )
    # Refused before anything was built or consumed: no factory ran, no consumer started.
    assert not list(tmp_path.glob("closed-*"))
    assert "started" not in result.stderr


def test_dependency_factories_are_closed_on_sigterm(
    e2e_env: E2EEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_topics(e2e_env.kafka, [e2e_env.prefix + EVENTS])
    monkeypatch.setenv("GATED_APP_DIR", str(tmp_path))
    settings = e2e_env.settings(instance_id="app-sigterm")
    proc = ProcessorProcess(
        settings,
        e2e_env.logs / "app-sigterm.log",
        app=APP,
    )
    e2e_env.procs.append(proc)
    wait_until(
        lambda: log_lines(proc, r"processor app-sigterm started") or not proc.alive(),
        timeout=90,
        what="the processor to start",
    )
    assert proc.alive(), proc.log()
    assert not (tmp_path / f"closed-{proc.pid}").exists()
    assert proc.stop() == 0, proc.log()  # SIGTERM
    assert (tmp_path / f"closed-{proc.pid}").read_text() == "closed\n", proc.log()
