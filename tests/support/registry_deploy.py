"""The registry app (tests/support/registry_app.py) run as `saga-processor run` processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg

from tests.support import registry_app as ra
from tests.support.harness import create_topics, query
from tests.support.procs import REPO


class Deployment:
    """One `saga-processor run` of the registry app (processor and participant in one process)."""

    def __init__(self, kafka: str, database_url: str, registry_url: str, log: Path) -> None:
        self.prefix = f"r{uuid.uuid4().hex[:8]}."
        self.schema = f"r_{uuid.uuid4().hex[:8]}"
        self.service = f"rs_{uuid.uuid4().hex[:8]}"
        self.kafka, self.database_url, self.registry_url = kafka, database_url, registry_url
        self.log = log
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
        self.env.update(
            {
                "PYTHONPATH": str(REPO),
                "SAGA_APP": "tests.support.registry_app:app",
                "SAGA_KAFKA__BOOTSTRAP_SERVERS": kafka,
                "SAGA_DATABASE__URL": database_url,
                "SAGA_DATABASE__SCHEMA_NAME": self.schema,
                "SAGA_PARTICIPANT__SCHEMA_NAME": self.service,
                "SAGA_PARTICIPANT__GROUP_ID": f"{self.prefix}answerer",
                "SAGA_CONSUMER__GROUP_ID": f"{self.prefix}processor",
                "SAGA_TOPIC_PREFIX": self.prefix,
                "SAGA_METRICS__PORT": "0",
                "SAGA_RELAY__POLL_INTERVAL": "200ms",
                "SAGA_SCHEMA_REGISTRY__URL": registry_url,
                "SAGA_SCHEMA_REGISTRY__TOPICS": json.dumps(ra.FORMATS),
            }
        )
        create_topics(kafka, [self.prefix + t for t in ra.TOPICS])
        self.proc: subprocess.Popen[bytes] | None = None

    def topic(self, name: str) -> str:
        return self.prefix + name

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "processor", "run"],
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def cli(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "processor", *args],
            check=False,
            cwd=REPO,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=120,
        )

    def ended(self) -> int:
        try:
            rows = query(
                self.database_url,
                self.schema,
                "SELECT count(*) FROM saga_instance WHERE status = 'ended'",
            )
        except psycopg.Error:
            return -1  # the schema is being made
        return int(rows[0][0])

    def kill(self) -> None:
        """SIGKILL: no stop, no flush, no leave; what was in flight is decided by the database."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                assert self.proc.wait(60) == 0
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()
                    self.proc.wait(10)

    def drop(self) -> None:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            for name in (self.schema, self.service):
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
