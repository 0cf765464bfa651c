"""A PostgreSQL cluster and a Kafka broker of one test's own, for tests that restart them.

The shared services are never restarted: these come from ``deploy/local`` on free ports (their
cluster name, ports and run directory come from the ``SAGA_PG_*``, ``SAGA_KAFKA_*`` and
``SAGA_LOCAL_DIR`` variables) and are removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from devstack import DEPLOY, cache_dir, wait_for_kafka
from tests.support.procs import alive
from tests.support.proxy import Proxy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kafka_jars() -> bool:
    return any(cache_dir().glob("kafka-*/libs/kafka_2.13-*.jar"))


@dataclass
class PrivateStack:
    """A PostgreSQL cluster and a Kafka broker that only this test uses.

    With ``kafka_proxy``, every client reaches the broker through that proxy (the broker
    advertises the proxy's port), so a test can black-hole the broker for all of them.
    """

    env: dict[str, str]
    kafka: str
    database: str
    kafka_proxy: Proxy | None = None

    def _script(self, service: str, action: str) -> None:
        command = self._start(service, action)
        if command.wait() != 0:
            raise subprocess.CalledProcessError(command.returncode, command.args)

    def up(self, service: str) -> None:
        self._script(service, "up")

    def _start(self, service: str, action: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [str(DEPLOY / f"{service}.sh"), action],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def up_both(self) -> None:
        """Starts PostgreSQL and the broker side by side: each start-up mostly waits."""
        started = {service: self._start(service, "up") for service in ("postgres", "kafka")}
        failed = [service for service, proc in started.items() if proc.wait() != 0]
        if failed:
            raise RuntimeError(f"deploy/local could not start {' and '.join(failed)}")

    def down(self, service: str) -> None:
        self._script(service, "down")

    def kill_kafka(self) -> None:
        """SIGKILLs the broker: no controlled shutdown, connections reset."""
        pidfile = Path(self.env["SAGA_LOCAL_DIR"]) / "kafka" / "kafka.pid"
        pid = int(pidfile.read_text())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while alive(pid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"broker {pid} still alive 30 s after SIGKILL")
            time.sleep(0.05)
        pidfile.unlink()


@contextmanager
def private_stack(tmp_path: Path, *, proxied_kafka: bool = False) -> Iterator[PrivateStack]:
    """A private PostgreSQL cluster and Kafka broker, removed afterwards (skips if impossible).

    ``proxied_kafka`` puts a :class:`Proxy` in front of the broker (see :class:`PrivateStack`).
    """
    if os.geteuid() != 0 or shutil.which("pg_createcluster") is None:
        pytest.skip("a private PostgreSQL cluster needs root and Debian's postgresql-common")
    if not _kafka_jars():
        pytest.skip("the Kafka jars are not cached (deploy/local/kafka.sh fetch)")
    cluster = f"sagat{uuid.uuid4().hex[:8]}"
    pg_port, kafka_port, controller_port = _free_port(), _free_port(), _free_port()
    env = {
        **os.environ,
        "SAGA_LOCAL_DIR": str(tmp_path / "stack"),
        "SAGA_PG_CLUSTER": cluster,
        "SAGA_PG_PORT": str(pg_port),
        "SAGA_KAFKA_PORT": str(kafka_port),
        "SAGA_KAFKA_CONTROLLER_PORT": str(controller_port),
    }
    stack = PrivateStack(
        env,
        kafka=f"127.0.0.1:{kafka_port}",
        database=f"postgresql://saga:saga@127.0.0.1:{pg_port}/saga",
    )
    if proxied_kafka:
        proxy = stack.kafka_proxy = Proxy(("127.0.0.1", kafka_port))
        env["SAGA_KAFKA_ADVERTISED_PORT"] = str(proxy.port)
        stack.kafka = f"127.0.0.1:{proxy.port}"
    try:
        stack.up_both()
        wait_for_kafka(stack.kafka, timeout=120)
        yield stack
    finally:
        if stack.kafka_proxy is not None:
            stack.kafka_proxy.heal()
        version = sorted(
            os.listdir("/usr/lib/postgresql"), key=lambda v: [int(p) for p in v.split(".")]
        )[-1]
        # Both go at once; each is waited for before the run moves on.
        dropping = subprocess.Popen(
            ["pg_dropcluster", "--stop", version, cluster],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        subprocess.run([str(DEPLOY / "kafka.sh"), "down"], env=env, check=False)
        dropping.wait()
        if stack.kafka_proxy is not None:
            stack.kafka_proxy.close()
        # pg_dropcluster leaves the directory behind when it holds files it did not create
        # (postgres.sh adds conf.d/saga.conf).
        shutil.rmtree(f"/etc/postgresql/{version}/{cluster}", ignore_errors=True)
