"""Starts the demo's order participants as `saga-processor participant run` runs them."""

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
        """Starts ``python -m processor participant run demo.participants:app``; with a
        ``fault`` (SAGA_FAULT_* variables, see tests.support.proc_main), the same app through
        tests.support.participant_main. ``stock`` and ``wallets`` are set first, from here.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
        env.update(
            {
                "SAGA_APP": "demo.participants:app",
                "SAGA_KAFKA__BOOTSTRAP_SERVERS": kafka,
                "SAGA_DATABASE__URL": database,
                "SAGA_PARTICIPANT__SCHEMA_NAME": schema,
                "SAGA_PARTICIPANT__GROUP_ID": group or f"{prefix}order-participants",
                "SAGA_TOPIC_PREFIX": prefix,
                # Any free port: several services run on one machine.
                "SAGA_METRICS__BIND_ANY": "true",
                "SAGA_METRICS__HOST": "127.0.0.1",
                "DEMO_PARTICIPANTS": ",".join(only),
                "PYTHONPATH": str(REPO),
            }
        )
        if shutdown_timeout is not None:
            env["SAGA_SHUTDOWN_TIMEOUT"] = f"{shutdown_timeout}s"
        env.update(fault or {})
        if stock or wallets:
            _stock(database, schema, stock or {}, wallets or {})
        if fault:
            args = [sys.executable, "-m", "tests.support.participant_main"]
        else:
            args = [sys.executable, "-m", "processor", "participant", "run"]
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


def _stock(
    database: str, schema: str, stock: Mapping[str, int], wallets: Mapping[str, Decimal]
) -> None:
    """Migrates the service's schema and sets its stock and wallets, as its operator would."""
    from demo.participants import app, seed
    from processor._bootstrap.participant import migrate
    from processor.settings import ProcessorSettings

    settings = ProcessorSettings(database={"url": database}, participant={"schema_name": schema})
    migrate(settings, app())
    seed(database, schema, stock, wallets)
