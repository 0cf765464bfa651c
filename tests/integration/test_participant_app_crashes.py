"""The inventory service of docs/participants.md, run by `saga-processor participant run` and
killed with SIGKILL while commands flow: no reply lost, none sent twice (counted from Kafka).

Every command is answered by one reply message id (a redelivery after a crash republishes that
same record, never a new one), the service's stock moved once per command, and a command
delivered again on purpose (the same message id) changed nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal
from functools import partial
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Producer

from processor._wire import HEADER_CAUSATION_ID, HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE
from schemas.orders import ORDER_COMMANDS_TOPIC, ORDER_EVENTS_TOPIC, ReserveStock
from tests.support.harness import Reader, create_topics, headers_for, query, wait_until
from tests.support.phases import CITUS_BUCKETS, CITUS_LAYOUT
from tests.support.procs import REPO

# Its own topics, group and schema on the shared services, which it never disturbs.
pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "demo.inventory_service:app"
COMMANDS = 600
REPEATED = 50
STOCK = 10_000


def _at_least(reader: Reader, n: int) -> bool:
    reader.poll()
    return len(reader.records) >= n


class Service:
    """`saga-processor participant run` as a process, started again after each kill."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.started = 0
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.started += 1
        with (self.logs / f"inventory-{self.started}.log").open("wb") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "processor", "participant", "run", APP],
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        assert self.popen is not None
        os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(30)

    def stop(self) -> int:
        assert self.popen is not None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(60)


@pytest.fixture
def service(kafka_bootstrap: str, database_url: str, tmp_path: Path) -> Iterator[Service]:
    prefix, schema = f"inv{uuid.uuid4().hex[:8]}.", f"inv_{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, [prefix + ORDER_COMMANDS_TOPIC, prefix + ORDER_EVENTS_TOPIC], 3)
    create_topics(kafka_bootstrap, [prefix + "saga-dead-letters"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "SAGA_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
            "SAGA_DATABASE__URL": database_url,
            "SAGA_PARTICIPANT__SCHEMA_NAME": schema,
            "SAGA_PARTICIPANT__GROUP_ID": f"{prefix}inventory",
            "SAGA_TOPIC_PREFIX": prefix,
            "SAGA_METRICS__BIND_ANY": "true",
            "SAGA_METRICS__HOST": "127.0.0.1",
            # A killed member's partitions move on soon; the default is 45 s.
            "SAGA_CONSUMER__SESSION_TIMEOUT": "6s",
            "SAGA_RELAY__POLL_INTERVAL": "200ms",
        }
    )
    by_bucket = os.environ.get(CITUS_LAYOUT) == "buckets"
    if by_bucket:
        # The Citus phase's second layout: the kit's tables by the bucket of each command's key;
        # the service's stock and reservations, with no bucket column, reference tables.
        env.update(
            {
                "SAGA_DATABASE__DISTRIBUTED": "buckets",
                "SAGA_DATABASE__BUCKETS": str(CITUS_BUCKETS),
            }
        )
    migrated = subprocess.run(
        [sys.executable, "-m", "processor", "participant", "migrate", "--app", APP],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert migrated.returncode == 0, migrated.stderr
    layout = query(
        database_url,
        schema,
        "SELECT count(*) FROM pg_class WHERE relname = 'bucket_layout'"
        " AND relnamespace = to_regnamespace(current_schema())",
    )
    assert layout == [(1 if by_bucket else 0,)]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'INSERT INTO "{schema}".stock VALUES (%s, %s)', ("sku-1", STOCK))
    svc = Service(env, tmp_path)
    try:
        yield svc
    finally:
        if svc.popen is not None and svc.popen.poll() is None:
            svc.popen.kill()
            svc.popen.wait(10)
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_a_killed_service_loses_no_reply_and_sends_none_twice(
    service: Service, kafka_bootstrap: str, database_url: str
) -> None:
    env = service.env
    prefix, schema = env["SAGA_TOPIC_PREFIX"], env["SAGA_PARTICIPANT__SCHEMA_NAME"]
    replies = Reader(kafka_bootstrap, [prefix + ORDER_EVENTS_TOPIC])
    sent: dict[str, str] = {}  # command message id -> order id
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})

    def send(order: str, mid: str) -> None:
        command = ReserveStock(
            order_id=order, customer_id="c-1", sku="sku-1", quantity=1, amount=Decimal("1")
        )
        headers = headers_for(command, mid, **{"saga-type": "order-saga", "saga-id": order})
        producer.produce(
            prefix + ORDER_COMMANDS_TOPIC,
            key=order.encode(),
            value=command.model_dump_json().encode(),
            headers=[(k, v) for k, v in headers],
        )
        producer.poll(0)

    def traffic(first: int, last: int) -> None:
        for i in range(first, last):
            order, mid = f"o-{i:04d}", str(uuid.uuid4())
            sent[mid] = order
            send(order, mid)
            if i % REPEATED == 0:
                send(order, mid)  # delivered twice on purpose: the same message id
            if i % 20 == 0:
                time.sleep(0.05)  # about 400 commands a second, across the kills
        assert producer.flush(30) == 0

    try:
        service.start()
        # Half the commands go before the kill and half after it: however fast the first
        # service works off its half, the second has commands of its own to handle.
        flow = threading.Thread(
            target=traffic, args=(0, COMMANDS // 2), name="commands", daemon=True
        )
        flow.start()
        # Killed a third of the way through: commands of its last batch were handled and their
        # replies not yet relayed, or relayed and not yet deleted.
        wait_until(partial(_at_least, replies, COMMANDS // 3), 90, "a third of the replies")
        service.kill()
        flow.join(60)
        assert not flow.is_alive()
        service.start()
        flow = threading.Thread(
            target=traffic, args=(COMMANDS // 2, COMMANDS), name="commands", daemon=True
        )
        flow.start()
        flow.join(60)
        assert not flow.is_alive()

        def answered() -> dict[str, set[str]]:
            out: dict[str, set[str]] = defaultdict(set)
            for m in replies.records:
                h = replies.headers(m)
                out[h[HEADER_CAUSATION_ID]].add(h[HEADER_MESSAGE_ID])
            return out

        replies.wait_for(lambda _: set(answered()) >= set(sent), 120, "a reply to every command")
        by_command = answered()
        assert set(by_command) == set(sent)
        # One reply record per command: any copy on the topic (a relay round cut by a kill)
        # carries the same message id.
        assert [mid for mid, ids in by_command.items() if len(ids) != 1] == []
        kinds = {replies.headers(m)[HEADER_MESSAGE_TYPE] for m in replies.records}
        assert kinds == {"orders.StockReserved"}
        assert service.stop() == 0
    finally:
        replies.close()
    assert query(database_url, schema, "SELECT available FROM stock") == [(STOCK - COMMANDS,)]
    assert query(database_url, schema, "SELECT count(*) FROM reservation") == [(COMMANDS,)]
    assert query(database_url, schema, "SELECT count(*) FROM inbox") == [(COMMANDS,)]
    assert service.started == 2
