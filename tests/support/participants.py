"""Starts the demo's order participants (``python -m demo.participants``) as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path

from tests.support.procs import REPO


class ParticipantProcess:
    """One participant service process; ``kill()`` is a SIGKILL, ``stop()`` a SIGTERM."""

    def __init__(
        self,
        *,
        kafka: str,
        database: str,
        schema: str,
        prefix: str,
        log_path: Path,
        only: Sequence[str] = (),
        group: str | None = None,
        stock: Mapping[str, int] | None = None,
        wallets: Mapping[str, Decimal] | None = None,
        fault: Mapping[str, str] | None = None,
        shutdown_timeout: float | None = None,
    ) -> None:
        """Starts ``python -m demo.participants``; with a ``fault`` (SAGA_FAULT_* variables,
        see tests.support.proc_main), the same service through tests.support.participant_main.
        """
        args = [
            sys.executable,
            "-m",
            "tests.support.participant_main" if fault else "demo.participants",
            "--bootstrap",
            kafka,
            "--database-url",
            database,
            "--schema",
            schema,
            "--prefix",
            prefix,
        ]
        if only:
            args += ["--only", ",".join(only)]
        if group:
            args += ["--group", group]
        if stock:
            args += ["--stock", ",".join(f"{k}={v}" for k, v in stock.items())]
        if wallets:
            args += ["--wallets", ",".join(f"{k}={v}" for k, v in wallets.items())]
        if shutdown_timeout is not None:
            args += ["--shutdown-timeout", str(shutdown_timeout)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
        env.update(fault or {})
        env["PYTHONPATH"] = str(REPO)
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        if self.alive():
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(30)
        self._log.close()

    def stop(self, timeout: float = 30) -> int:
        if self.alive():
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
