"""Finds or starts the real Kafka broker and PostgreSQL server the tests run against.

Order of preference: environment variables (services that already run), then testcontainers when
a Docker engine answers, then the local stack under deploy/local (no Docker needed). Whatever this
module starts, it stops; a service that was running before is left running.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "deploy" / "local" / "stack.sh"
KAFKA_SH = REPO / "deploy" / "local" / "kafka.sh"

ENV_KAFKA = "SAGA_TEST_KAFKA_BOOTSTRAP"
ENV_DATABASE = "SAGA_TEST_DATABASE_URL"


@dataclass(frozen=True)
class Services:
    kafka_bootstrap: str
    database_url: str
    # Set only when the broker is the local stack's, which tests may stop and start again.
    restart_kafka: Callable[[], None] | None


def _docker_answers() -> bool:
    """True when a Docker engine answers a ping on its socket (the CLI alone is not enough)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return True  # a remote engine was configured on purpose; let testcontainers use it
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(3)
            sock.connect(host.removeprefix("unix://"))
            sock.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
            return b" 200 " in sock.recv(64)
    except OSError:
        return False


def _local_stack_env() -> dict[str, str]:
    out = subprocess.run([str(STACK), "env"], check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.split())


def _restart_local_kafka() -> None:
    subprocess.run([str(KAFKA_SH), "down"], check=True)
    subprocess.run([str(KAFKA_SH), "up"], check=True)


def _stack(command: str, echo: Callable[[str], None]) -> None:
    """Runs the stack script, showing its lines (readiness times) past pytest's capture."""
    done = subprocess.run([str(STACK), command], check=False, capture_output=True, text=True)
    for line in (done.stdout + done.stderr).splitlines():
        echo(line)
    if done.returncode != 0:
        raise RuntimeError(f"deploy/local/stack.sh {command} failed (exit {done.returncode})")


@contextmanager
def provide_services(echo: Callable[[str], None] = print) -> Iterator[Services]:
    kafka = os.environ.get(ENV_KAFKA)
    database = os.environ.get(ENV_DATABASE)
    with ExitStack() as stack:
        if not (kafka and database) and _docker_answers():
            from testcontainers.kafka import KafkaContainer  # type: ignore[import-untyped]
            from testcontainers.postgres import PostgresContainer  # type: ignore[import-untyped]

            if not kafka:
                container = stack.enter_context(KafkaContainer("apache/kafka:4.1.1").with_kraft())
                kafka = container.get_bootstrap_server()
            if not database:
                pg = stack.enter_context(PostgresContainer("postgres:16", driver=None))
                database = pg.get_connection_url()
        restart: Callable[[], None] | None = None
        if not (kafka and database):
            _stack("up", echo)
            stack.callback(_stack, "down", echo)
            local = _local_stack_env()
            if not kafka:
                kafka = local[ENV_KAFKA]
                if _started_here("kafka"):
                    restart = _restart_local_kafka
            database = database or local[ENV_DATABASE]
        elif os.environ.get("SAGA_TEST_ALLOW_BROKER_RESTART") == "1" and _local_kafka_running():
            # A broker someone else started may be shared: restart it only when asked to.
            restart = _restart_local_kafka
        wait_for_kafka(kafka)
        yield Services(kafka_bootstrap=kafka, database_url=database, restart_kafka=restart)


def _started_here(service: str) -> bool:
    """Whether the stack script of this checkout started `service` (it leaves a marker)."""
    local_dir = Path(os.environ.get("SAGA_LOCAL_DIR", REPO / ".local"))
    return (local_dir / f"started-{service}").exists()


def _local_kafka_running() -> bool:
    return (
        subprocess.run([str(KAFKA_SH), "status"], check=False, capture_output=True).returncode == 0
    )


def wait_for_kafka(bootstrap: str, timeout: float = 60.0) -> None:
    """Blocks until the broker answers metadata requests and can take an idempotent write."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    admin = AdminClient({"bootstrap.servers": bootstrap})
    while True:
        try:
            admin.list_topics(timeout=5)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    # An idempotent producer needs the transaction coordinator, which loads after metadata is up.
    remaining = max(1.0, deadline - time.monotonic())
    if producer.flush(remaining) != 0 or not _probe_write(producer, remaining):
        raise TimeoutError(f"Kafka at {bootstrap} did not accept an idempotent write")


def _probe_write(producer: object, timeout: float) -> bool:
    from confluent_kafka import KafkaError, Producer

    assert isinstance(producer, Producer)
    result: list[KafkaError | None] = []
    producer.produce("__saga_probe", b"probe", on_delivery=lambda err, _msg: result.append(err))
    producer.flush(timeout)
    return bool(result) and result[0] is None
