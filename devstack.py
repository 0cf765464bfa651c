"""Finds or starts the Kafka broker and PostgreSQL server that tests, the demo and benchmarks use.

Order of preference: `SAGA_TEST_KAFKA_BOOTSTRAP` / `SAGA_TEST_DATABASE_URL` (services that
already run), then testcontainers when a Docker engine answers, then the local stack under
`deploy/local` (no Docker needed). Whatever `provide()` starts, it stops on exit (unless asked to
keep it); a service that was running before is left running. A Schema Registry, which only
the topics in a registry's wire format need, comes from `provide_registry()`, the same way.

This module lives outside the `processor` package and the wheel: it is development tooling.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent
DEPLOY = REPO / "deploy" / "local"
STACK = DEPLOY / "stack.sh"

ENV_KAFKA = "SAGA_TEST_KAFKA_BOOTSTRAP"
ENV_DATABASE = "SAGA_TEST_DATABASE_URL"
# A broker someone else started may be shared: tests restart it only when this is "1".
ENV_ALLOW_RESTART = "SAGA_TEST_ALLOW_BROKER_RESTART"

KAFKA_IMAGE = "apache/kafka:4.1.1"


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where the stack keeps what it fetched (deploy/local/common.sh says the same)."""
    return Path(
        env.get("SAGA_CACHE_DIR")
        or Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "saga-processor"
    )


POSTGRES_IMAGE = "postgres:16"


@dataclass(frozen=True)
class Services:
    """Where the services answer, and whether the broker may be restarted."""

    kafka_bootstrap: str
    database_url: str
    # Set only when the broker is the local stack's and may be stopped and started again.
    restart_kafka: Callable[[], None] | None = None


@contextmanager
def provide(echo: Callable[[str], None] = print, *, keep: bool = False) -> Iterator[Services]:
    """Yields running services, starting what is missing; stops on exit what it started.

    Args:
        echo: Where progress lines go (the stack scripts' readiness times among them).
        keep: Leave the local stack's services that this call started running on exit (the demo's
            `--keep-stack`; containers always stop with the process).
    """
    kafka = os.environ.get(ENV_KAFKA)
    database = os.environ.get(ENV_DATABASE)
    with ExitStack() as cleanup:
        if kafka and database:
            echo(f"using running services: Kafka {kafka}, PostgreSQL from ${ENV_DATABASE}")
        elif _docker_answers():
            kafka, database = _containers(cleanup, kafka, database)
        restart: Callable[[], None] | None = None
        if not (kafka and database):
            started = _stack_up(echo, None if keep else cleanup)
            local = _stack_env()
            if not kafka:
                kafka = local[ENV_KAFKA]
                if "kafka" in started:
                    restart = _restart_local_kafka
            database = database or local[ENV_DATABASE]
        elif os.environ.get(ENV_ALLOW_RESTART) == "1" and _running("kafka"):
            restart = _restart_local_kafka
        wait_for_kafka(kafka)
        yield Services(kafka_bootstrap=kafka, database_url=database, restart_kafka=restart)


# Every process of a test run carries this variable (tests/run.py ends the ones left behind).
# Not a SAGA_* name: some tests start processes with the SAGA_* variables removed.
TEST_RUN_MARK = "PROCESSOR_TEST_RUN"

ENV_CITUS = "SAGA_TEST_CITUS_URL"
CITUS = DEPLOY / "citus.sh"
# `citus.sh status` exit codes: running, stopped, and Citus not installed in PostgreSQL.
_CITUS_RUNNING, _CITUS_STOPPED, _CITUS_MISSING = 0, 3, 4


@dataclass(frozen=True)
class Citus:
    """A Citus coordinator to run the Citus tests against, or why there is none."""

    url: str | None
    reason: str = ""


@contextmanager
def provide_citus(echo: Callable[[str], None] = print) -> Iterator[Citus]:
    """Yields a Citus coordinator: `SAGA_TEST_CITUS_URL`, else the local one (deploy/local/citus.sh)
    when this machine's PostgreSQL has the extension; stops on exit what it started.

    Citus is not in Debian's packages, so a fresh machine has none: the yielded value then has
    no URL and says why.
    """
    given = os.environ.get(ENV_CITUS)
    if given:
        echo(f"using the Citus coordinator from ${ENV_CITUS}")
        yield Citus(given)
        return
    status = subprocess.run([str(CITUS), "status"], check=False, capture_output=True).returncode
    if status == _CITUS_MISSING:
        docker = _docker_answers()
        with ExitStack() as cleanup:
            started = _citus_containers(cleanup, echo) if docker else None
            yield Citus(started) if started else Citus(None, citus_missing_reason(docker=docker))
        return
    with ExitStack() as cleanup:
        if status != _CITUS_RUNNING:
            cleanup.callback(_run, [str(CITUS), "down"], echo, check=False)
            echo("bringing up the local Citus cluster (a coordinator and two workers)")
        _run([str(CITUS), "up"], echo)
        url = subprocess.run([str(CITUS), "url"], check=True, capture_output=True, text=True)
        yield Citus(url.stdout.strip())


def citus_missing_reason(*, docker: bool) -> str:
    """Why there is no Citus to test against, as the citus phase prints it."""
    engine = (
        "the Docker engine could not start the Citus image"
        if docker
        else "no Docker engine answers"
    )
    installed = "Citus is not installed in this machine's PostgreSQL"
    return f"{installed}, {engine}, and ${ENV_CITUS} is not set"


ENV_SCHEMA_REGISTRY = "SAGA_TEST_SCHEMA_REGISTRY_URL"
# A registry someone else started may be shared: tests stop and start it only when this is "1"
# (tests/run.py sets it for the registry it started).
ENV_ALLOW_REGISTRY_RESTART = "SAGA_TEST_ALLOW_REGISTRY_RESTART"
REGISTRY = DEPLOY / "registry.sh"


@dataclass(frozen=True)
class Registry:
    """A Schema Registry's Confluent-compatible API, and its controls when this run may use them."""

    url: str
    # Set only when the registry is the local stack's and this run started it. `stop` ends its
    # JVM; `start` brings it back on the same port, with the schemas and ids it had (the local
    # registry keeps them in a file unless SAGA_REGISTRY_STORAGE=memory).
    stop: Callable[[], None] | None = None
    start: Callable[[], None] | None = None


@contextmanager
def provide_registry(echo: Callable[[str], None] = print) -> Iterator[Registry]:
    """Yields a Schema Registry: `SAGA_TEST_SCHEMA_REGISTRY_URL`, else the local one
    (deploy/local/registry.sh: Apicurio from Maven Central), started if need be and then
    stopped on exit.

    A given URL comes without controls, unless `SAGA_TEST_ALLOW_REGISTRY_RESTART=1` says that
    the run which set it started this checkout's registry (tests/run.py): then a test may stop
    and start it. A registry that already ran here, or another checkout's on the same port, is
    used and left running, without controls.
    """
    given = os.environ.get(ENV_SCHEMA_REGISTRY)
    if given:
        echo(f"using the Schema Registry from ${ENV_SCHEMA_REGISTRY}")
        if os.environ.get(ENV_ALLOW_REGISTRY_RESTART) == "1" and _running("registry"):
            # The registry belongs to the run that started it, not to the test that restarts
            # it: it must not carry this run's mark, or the run would end it with the test's
            # processes (tests/run.py), and the phases after that one would find none.
            unmarked = _unmarked()
            yield Registry(given, stop=_stop_registry, start=lambda: _start_registry(unmarked))
        else:
            yield Registry(given)
        return
    with ExitStack() as cleanup:
        was_running = _running("registry")
        if not was_running:
            # Registered first: a registry that starts but never answers is stopped too.
            cleanup.callback(_stop_registry_if_running, echo)
        # Started with this process's environment, its mark included: should a pytest that
        # started it be killed, tests/run.py ends the registry with the rest of its processes.
        env = dict(os.environ)
        _run([str(REGISTRY), "up"], echo, env=env)
        url = subprocess.run(
            [str(REGISTRY), "url"], check=True, capture_output=True, text=True
        ).stdout.strip()
        if not was_running and _running("registry"):
            yield Registry(url, stop=_stop_registry, start=lambda: _start_registry(env))
        else:
            yield Registry(url)


def _unmarked() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != TEST_RUN_MARK}


def _stop_registry() -> None:
    subprocess.run([str(REGISTRY), "down"], check=True)


def _start_registry(env: Mapping[str, str]) -> None:
    subprocess.run([str(REGISTRY), "up"], check=True, env=env)


def _stop_registry_if_running(echo: Callable[[str], None]) -> None:
    # A test may have left it stopped, or started it again (another pid): the pidfile says which.
    if _running("registry"):
        echo("stopping the Schema Registry (this run started it)")
        _run([str(REGISTRY), "down"], echo, check=False)


def wait_for_kafka(bootstrap: str, timeout: float = 60.0) -> None:
    """Blocks until the broker answers metadata requests and can take an idempotent write.

    Raises:
        TimeoutError: The broker did not take the write within ``timeout`` seconds.
    """
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    # Errors only: retries while the broker and its coordinator load are what is waited for.
    config: dict[str, str | int | float | bool] = {"bootstrap.servers": bootstrap, "log_level": 3}
    deadline = time.monotonic() + timeout
    admin = AdminClient(config)
    while True:
        try:
            admin.list_topics(timeout=5)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
    producer = Producer({**config, "enable.idempotence": True})
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


# -- testcontainers ----------------------------------------------------------------------------


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


def _containers(
    cleanup: ExitStack, kafka: str | None, database: str | None
) -> tuple[str | None, str | None]:
    """Starts a container for each service not given; they stop when `cleanup` closes."""
    try:
        from testcontainers.kafka import KafkaContainer
        from testcontainers.postgres import PostgresContainer
    except ImportError:  # the `test` extra is not installed: the local stack serves instead
        return kafka, database
    if not kafka:
        broker = cleanup.enter_context(KafkaContainer(KAFKA_IMAGE).with_kraft())
        kafka = broker.get_bootstrap_server()
    if not database:
        pg = cleanup.enter_context(PostgresContainer(POSTGRES_IMAGE, driver=None))
        database = pg.get_connection_url()
    return kafka, database


CITUS_IMAGE = "citusdata/citus:13.2.0"
_CITUS_NODES = ("coordinator", "worker1", "worker2")
CITUS_TEST_FLAGS = "-c fsync=off -c ssl=off -c jit=off -c citus.node_conninfo=sslmode=disable"


def _citus_containers(cleanup: ExitStack, echo: Callable[[str], None]) -> str | None:
    """Starts a coordinator and two workers from the official image on a network of their own;
    returns the coordinator's URL, or None when the image cannot be run here.

    The image is PostgreSQL's with Citus, so each node is a `PostgresContainer` (which waits
    until the server answers, as for the PostgreSQL service). The nodes reach each other by
    their aliases and trust one another on that network (as the local cluster trusts loopback);
    only the test run reaches them, through mapped ports.
    """
    try:
        from testcontainers.core.network import Network
        from testcontainers.postgres import PostgresContainer
    except ImportError:
        return None
    echo(f"starting a Citus coordinator and two workers ({CITUS_IMAGE}) with testcontainers")
    try:
        network = cleanup.enter_context(Network())
        urls: dict[str, str] = {}
        for alias in _CITUS_NODES:
            node = cleanup.enter_context(
                PostgresContainer(
                    CITUS_IMAGE, username="saga", password="saga", dbname="saga", driver=None
                )
                .with_env("POSTGRES_HOST_AUTH_METHOD", "trust")
                # As the local cluster (deploy/local/citus.sh, write_test_speed): no TLS between
                # the nodes (Citus turns it on when it is created) and no JIT; on the command
                # line, which ALTER SYSTEM's settings do not override.
                .with_command(CITUS_TEST_FLAGS)
                .with_network(network)
                .with_network_aliases(alias)
            )
            urls[alias] = node.get_connection_url()
            _sql(urls[alias], "CREATE EXTENSION IF NOT EXISTS citus")
        _sql(urls["coordinator"], "SELECT citus_set_coordinator_host('coordinator', 5432)")
        for worker in _CITUS_NODES[1:]:
            _sql(urls["coordinator"], f"SELECT citus_add_node('{worker}', 5432)")
    except Exception as exc:  # no image, no pull, a refused start: say so, skip the phase
        echo(f"the Citus containers did not come up: {type(exc).__name__}: {exc}")
        return None
    return urls["coordinator"]


def _sql(url: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(statement.encode())


# -- the local stack ---------------------------------------------------------------------------


def _stack_up(echo: Callable[[str], None], cleanup: ExitStack | None) -> list[str]:
    """Runs `stack.sh up`; returns the services it started (down before, running after).

    A broker that another checkout serves on the port is used, not started, so it is not in the
    list. `--untracked`: what to stop is decided here, from that comparison, and not from the
    stack's marker files, which another run in the same checkout may write or remove. With a
    `cleanup` stack, what was started is stopped when it closes, even when `up` fails halfway.
    """
    down_before = [s for s in ("postgres", "kafka") if not _running(s)]
    if cleanup is not None:
        cleanup.callback(_stop, down_before, echo)
    echo(f"bringing up the local stack (down: {', '.join(down_before) or 'nothing'})")
    _run([str(STACK), "up", "--untracked"], echo)
    return [s for s in down_before if _running(s)]


def _stop(down_before: list[str], echo: Callable[[str], None]) -> None:
    """Stops the services that were down before `up` and run now, in reverse order."""
    for service in reversed(down_before):
        if _running(service):
            echo(f"stopping {service} (this run started it)")
            _run([str(DEPLOY / f"{service}.sh"), "down"], echo, check=False)


def _stack_env() -> dict[str, str]:
    out = subprocess.run([str(STACK), "env"], check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.split())


def _running(service: str) -> bool:
    """Whether the stack script of this checkout runs `service` (`<service>.sh status`)."""
    script = DEPLOY / f"{service}.sh"
    return subprocess.run([str(script), "status"], check=False, capture_output=True).returncode == 0


def _restart_local_kafka() -> None:
    subprocess.run([str(DEPLOY / "kafka.sh"), "down"], check=True)
    # The broker belongs to whoever started the stack, not to the test that restarts it: it
    # must not carry the test run's mark, or the run would end it with the test's processes
    # (tests/run.py), and the phases after that one would find no broker.
    env = {k: v for k, v in os.environ.items() if k != TEST_RUN_MARK}
    subprocess.run([str(DEPLOY / "kafka.sh"), "up"], check=True, env=env)


def _run(
    command: list[str],
    echo: Callable[[str], None],
    *,
    check: bool = True,
    env: Mapping[str, str] | None = None,
) -> None:
    """Runs a stack script, passing each of its lines (readiness times) to `echo` as it comes."""
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            echo(line.rstrip("\n"))
    if check and proc.returncode != 0:
        name = Path(command[0]).name
        raise RuntimeError(f"deploy/local/{name} {command[1]} failed (exit {proc.returncode})")
