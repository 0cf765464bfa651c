"""Starts processor processes with settings turned into SAGA_* environment variables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from processor.settings import ProcessorSettings

REPO = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has ended: only its parent's reaping is left)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def settings_env(settings: ProcessorSettings) -> dict[str, str]:
    """The SAGA_* variables that reproduce `settings` in a child process."""
    data = settings.model_dump(mode="json", by_alias=True)
    data["database"]["url"] = settings.database.url.get_secret_value()
    # The dump masks credentials; the child needs the real values.
    data["kafka"]["config"] = {
        k: v for k, v in settings.kafka.client_config().items() if k in settings.kafka.config
    }
    if settings.operator.key is not None:
        data["operator"]["key"] = settings.operator.key.get_secret_value()
    env: dict[str, str] = {}
    for key, value in data.items():
        if value is None:
            continue
        env[f"SAGA_{key.upper()}"] = value if isinstance(value, str) else json.dumps(value)
    return env


class ProcessorProcess:
    def __init__(
        self,
        settings: ProcessorSettings,
        log_path: Path,
        fault: Mapping[str, str] | None = None,
        sagas: str | None = None,
        app: str | None = None,
    ) -> None:
        """Starts `python -m tests.support.proc_main` with `settings` as SAGA_* variables.

        Args:
            settings: The processor's settings.
            log_path: Where its stdout and stderr go.
            fault: SAGA_FAULT_* variables (see tests.support.proc_main).
            sagas: One SAGA_SAGAS entry instead of the settings' sagas.
            app: The application object (MODULE:ATTR) as SAGA_APP; the settings' sagas are
                then left out, since the app names the sagas.
        """
        env = {**os.environ, **settings_env(settings), **(fault or {})}
        if sagas:
            env["SAGA_SAGAS"] = json.dumps([sagas])
        if app:
            env["SAGA_APP"] = app
            env.pop("SAGA_SAGAS", None)
        env["PYTHONPATH"] = str(REPO)
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tests.support.proc_main"],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(30)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, then SIGKILL past the timeout; returns the exit code."""
        if self.alive():
            os.kill(self.pid, signal.SIGCONT)  # a stopped process cannot handle SIGTERM
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self._log.close()
        return self.popen.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def processes(*procs: ProcessorProcess) -> Iterator[tuple[ProcessorProcess, ...]]:
    """Makes sure every started process is gone when the test ends, whatever happened."""
    try:
        yield procs
    finally:
        for p in procs:
            p.stop()
