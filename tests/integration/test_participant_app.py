"""`saga-processor participant run|migrate` with the demo's order participants as the app."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from processor._authoring.application import ParticipantApp, load_participant_app
from processor._errors import ConfigurationError, SagaError
from processor.participant import Replies, command_handler, participant
from processor.settings import ProcessorSettings
from schemas.orders import (
    ORDER_COMMANDS_TOPIC,
    ORDER_EVENTS_TOPIC,
    ReserveStock,
    StockReserved,
)
from tests.support.harness import Reader, create_topics, headers_for, query, wait_until
from tests.support.procs import REPO

pytestmark = pytest.mark.integration


class Ledger:
    """A dependency nothing provides."""


@participant(name="needs-ledger")
class NeedsLedger:
    @command_handler()
    def reserve(self, command: ReserveStock, replies: Replies, ledger: Ledger) -> None:
        """Never run here."""


def test_an_app_names_what_its_handlers_miss_before_it_runs() -> None:
    settings = ProcessorSettings(database={"url": "postgresql://unused"})
    with pytest.raises(ConfigurationError, match="Ledger"):
        ParticipantApp(participants=[NeedsLedger]).check(settings)
    with pytest.raises(ConfigurationError, match="names no participant"):
        ParticipantApp(participants=[])
    with pytest.raises(SagaError, match="not a ParticipantApp"):
        load_participant_app("sagas.app:app")
    assert load_participant_app("demo.participants:app").migrations


def _env(kafka: str, database: str, schema: str, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "SAGA_KAFKA__BOOTSTRAP_SERVERS": kafka,
            "SAGA_DATABASE__URL": database,
            "SAGA_PARTICIPANT__SCHEMA_NAME": schema,
            "SAGA_PARTICIPANT__GROUP_ID": f"{prefix}inventory",
            "SAGA_TOPIC_PREFIX": prefix,
            "SAGA_METRICS__BIND_ANY": "true",
            "SAGA_METRICS__HOST": "127.0.0.1",
            "SAGA_LOG_FORMAT": "json",
            "DEMO_PARTICIPANTS": "inventory",
        }
    )
    return env


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "processor", "participant", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def service_env(kafka_bootstrap: str, database_url: str) -> Iterator[dict[str, str]]:
    prefix = f"pa{uuid.uuid4().hex[:8]}."
    schema = f"pa_{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, [prefix + t for t in (ORDER_COMMANDS_TOPIC, ORDER_EVENTS_TOPIC)])
    create_topics(kafka_bootstrap, [prefix + "saga-dead-letters"])
    yield _env(kafka_bootstrap, database_url, schema, prefix)
    with __import__("psycopg").connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_migrate_makes_the_kits_tables_and_the_apps_own_once(
    service_env: dict[str, str], database_url: str
) -> None:
    env = {**service_env, "SAGA_APP": "demo.participants:app"}
    schema = env["SAGA_PARTICIPANT__SCHEMA_NAME"]
    for _ in range(2):
        done = _cli(env, "migrate")
        assert done.returncode == 0, done.stderr
    tables = {
        r[0]
        for r in query(
            database_url,
            schema,
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            schema,
        )
    }
    assert {"inbox", "outbox", "stock", "wallet", "service_schema_version"} <= tables
    assert query(database_url, schema, "SELECT count(*) FROM service_schema_version") == [(1,)]


def test_run_answers_commands_serves_its_probes_and_stops_on_sigterm(
    service_env: dict[str, str], kafka_bootstrap: str, database_url: str, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    from demo.participants import seed

    env = service_env
    prefix, schema = env["SAGA_TOPIC_PREFIX"], env["SAGA_PARTICIPANT__SCHEMA_NAME"]
    assert _cli({**env, "SAGA_APP": "demo.participants:app"}, "migrate").returncode == 0
    seed(database_url, schema, {"sku-1": 3}, {})
    log = tmp_path / "inventory.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "processor", "participant", "run", "demo.participants:app"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        found = wait_until(
            lambda: re.search(r"/readyz on port (\d+)", log.read_text()), 60, "the endpoint"
        )
        assert found is not None
        port = int(found.group(1))
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        command = ReserveStock(
            order_id="o-1", customer_id="c-1", sku="sku-1", quantity=2, amount=Decimal("5")
        )
        headers = headers_for(command, **{"saga-type": "order-saga", "saga-id": "o-1"})
        producer.produce(
            prefix + ORDER_COMMANDS_TOPIC,
            key=b"o-1",
            value=command.model_dump_json().encode(),
            headers=[(k, v) for k, v in headers],
        )
        assert producer.flush(30) == 0
        replies = Reader(kafka_bootstrap, [prefix + ORDER_EVENTS_TOPIC])
        try:
            replies.wait_for(lambda rs: len(rs) >= 1, 60, "the reply")
            [reply] = replies.records
            assert json.loads(reply.value()) == json.loads(
                StockReserved(order_id="o-1").model_dump_json()
            )
        finally:
            replies.close()
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(base + "/healthz", timeout=5) as r:
            assert r.status == 200
        with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert 'saga_participant_commands_total{outcome="handled"} 1.0' in metrics
        assert "saga_participant_up 1.0" in metrics
        stock = query(database_url, schema, "SELECT available FROM stock WHERE sku = 'sku-1'")
        assert stock == [(1,)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any("participant service" in line.get("message", "") for line in lines)
