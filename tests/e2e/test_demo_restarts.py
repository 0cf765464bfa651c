"""The demo's accounts service goes on after PostgreSQL and the Kafka broker restart.

The shared services are never restarted: this test starts its own PostgreSQL cluster and Kafka
broker from ``deploy/local`` on free ports (their cluster name, ports and run directory come
from the ``SAGA_PG_*``, ``SAGA_KAFKA_*`` and ``SAGA_LOCAL_DIR`` variables), restarts those under
load, and removes them afterwards.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

from demo.accounts import AccountsService
from devstack import DEPLOY, wait_for_kafka
from schemas.transfers import (
    ACCOUNT_COMMANDS_TOPIC,
    TRANSFER_EVENTS_TOPIC,
    CreditAccount,
    DebitAccount,
)
from tests.support.harness import Publisher, Reader, create_topics, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

ACCOUNTS = {f"acc{i}": Decimal("1000.00") for i in range(6)}
PER_PHASE = 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kafka_jars() -> bool:
    cache = Path(
        os.environ.get("SAGA_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "saga-processor"
    )
    return any(cache.glob("kafka-*/libs/kafka_2.13-*.jar"))


@dataclass
class PrivateStack:
    """A PostgreSQL cluster and a Kafka broker that only this test uses."""

    env: dict[str, str]
    kafka: str
    database: str

    def _script(self, service: str, action: str) -> None:
        subprocess.run(
            [str(DEPLOY / f"{service}.sh"), action],
            env=self.env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def up(self, service: str) -> None:
        self._script(service, "up")

    def down(self, service: str) -> None:
        self._script(service, "down")


@pytest.fixture
def private_stack(tmp_path: Path) -> Iterator[PrivateStack]:
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
    try:
        stack.up("postgres")
        stack.up("kafka")
        wait_for_kafka(stack.kafka, timeout=120)
        yield stack
    finally:
        subprocess.run([str(DEPLOY / "kafka.sh"), "down"], env=env, check=False)
        version = sorted(
            os.listdir("/usr/lib/postgresql"), key=lambda v: [int(p) for p in v.split(".")]
        )[-1]
        subprocess.run(
            ["pg_dropcluster", "--stop", version, cluster],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # pg_dropcluster leaves the directory behind when it holds files it did not create
        # (postgres.sh adds conf.d/saga.conf).
        shutil.rmtree(f"/etc/postgresql/{version}/{cluster}", ignore_errors=True)


def test_accounts_service_survives_postgres_and_kafka_restarts(
    private_stack: PrivateStack,
) -> None:
    stack = private_stack
    prefix = f"rs{uuid.uuid4().hex[:6]}."
    commands, replies = prefix + ACCOUNT_COMMANDS_TOPIC, prefix + TRANSFER_EVENTS_TOPIC
    create_topics(stack.kafka, [commands, replies], partitions=3)
    service = AccountsService(
        kafka={"bootstrap.servers": stack.kafka},
        database_url=stack.database,
        schema="demo_accounts",
        topic_prefix=prefix,
        application_name=f"accounts-{prefix}",
    )
    service.open_accounts(ACCOUNTS)
    before = service.total()
    stop = threading.Event()
    runner = threading.Thread(target=service.run, args=(stop,), name="accounts", daemon=True)
    reader = Reader(stack.kafka, [replies])
    published: list[str] = []

    def publish(phase: str) -> None:
        pub = Publisher(stack.kafka)
        names = sorted(ACCOUNTS)
        for n in range(PER_PHASE):
            tid = f"{phase}-{n}"
            src, dst = names[n % len(names)], names[(n + 1) % len(names)]
            amount = Decimal("1.25")
            pub.event(commands, tid, DebitAccount(transfer_id=tid, account_id=src, amount=amount))
            pub.event(commands, tid, CreditAccount(transfer_id=tid, account_id=dst, amount=amount))
            published.append(tid)
        pub.flush()

    def answered(records: list[object]) -> bool:
        # One confirmation per step: a debit and a credit for every transfer published so far.
        seen = {(reader.headers(m)["message-type"], m.key().decode()) for m in records}  # type: ignore[attr-defined]
        wanted = {
            (t, tid)
            for tid in published
            for t in ("transfers.DebitConfirmed", "transfers.CreditConfirmed")
        }
        return wanted <= seen

    runner.start()
    try:
        publish("p1")
        reader.wait_for(answered, timeout=60, what="replies before any restart")

        # PostgreSQL goes away while commands keep coming: the service must notice, wait, and
        # replace its connection once the server is back.
        stack.down("postgres")
        publish("p2")
        wait_until(lambda: service.counters.failed_batches > 0, timeout=60, what="a failed batch")
        stack.up("postgres")
        reader.wait_for(answered, timeout=120, what="replies after the PostgreSQL restart")
        assert service.reconnects >= 1

        # The broker restarts with commands in flight.
        publish("p3")
        stack.down("kafka")
        stack.up("kafka")
        publish("p4")
        reader.wait_for(answered, timeout=180, what="replies after the broker restart")
    finally:
        stop.set()
        runner.join(60)
        reader.close()
    assert not runner.is_alive()
    # Every step applied exactly once: each transfer moved money from one account to another.
    steps = service.ledger.steps()
    assert len(steps) == 2 * len(published)
    assert {outcome for _, _, outcome in steps} == {"applied"}
    assert service.total() == before
    service.close()
