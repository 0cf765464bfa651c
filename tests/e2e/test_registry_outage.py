"""The Schema Registry stopped for 30 s under load: the records wait, nothing lost or doubled.

A partner publishes Avro events all along; its schema gains a version just before the registry
stops, so the processor meets a schema id it has never fetched while the registry is away, and
the processor is killed and started again in the middle of the outage, so it has fetched
nothing at all. The registry is this test's own (deploy/local/registry.sh on free ports, its
schemas in a file, as a production registry keeps them); the shared one is never stopped.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from devstack import DEPLOY
from tests.support import registry_app as ra
from tests.support.harness import query, wait_until
from tests.support.registry_deploy import Deployment

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

OUTAGE_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRegistry:
    """A registry of this test's own, stopped and started through deploy/local/registry.sh."""

    def __init__(self, run_dir: Path) -> None:
        self.env = {
            **os.environ,
            "SAGA_LOCAL_DIR": str(run_dir),
            "SAGA_REGISTRY_PORT": str(_free_port()),
            "SAGA_REGISTRY_MANAGEMENT_PORT": str(_free_port()),
        }
        self.url = f"http://127.0.0.1:{self.env['SAGA_REGISTRY_PORT']}/apis/ccompat/v7"

    def _script(self, action: str) -> None:
        subprocess.run(
            [str(DEPLOY / "registry.sh"), action],
            env=self.env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=180,
        )

    def up(self) -> None:
        self._script("up")

    def down(self) -> None:
        self._script("down")


@pytest.fixture
def private_registry(tmp_path: Path) -> Iterator[PrivateRegistry]:
    made = PrivateRegistry(tmp_path / "local")
    made.up()
    try:
        yield made
    finally:
        made.down()


class Partner:
    """Publishes Avro events from a thread until told to stop; v2 of its schema on request."""

    def __init__(self, kafka: str, registry: SchemaRegistryClient, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": kafka, "enable.idempotence": True})
        self.topic = topic
        self.ctx = SerializationContext(topic, MessageField.VALUE)
        self.v1 = AvroSerializer(registry, ra.PARTNER_AVRO_SCHEMA)
        self.v2 = AvroSerializer(registry, ra.PARTNER_AVRO_SCHEMA_V2)
        self.use_v2 = False
        self.sent: list[str] = []
        # What the registry client raised, newest last: a partner retries, as a producer
        # would, and a test that waits in vain for its records says why.
        self.errors: list[str] = []
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, name="partner", daemon=True)

    def serialize(self, i: int) -> bytes:
        body = {"ask_id": f"o-{i}", "amount": i}
        if self.use_v2:
            return bytes(self.v2({**body, "channel": "app"}, self.ctx))
        return bytes(self.v1(body, self.ctx))

    def register_next_version(self) -> None:
        """Registers v2 (its first use does); :attr:`use_v2` sends it."""
        self.v2({"ask_id": "-", "amount": 0, "channel": "app"}, self.ctx)

    def _run(self) -> None:
        i = 0
        while not self.halt.is_set():
            # The serializers keep the ids they registered: they need no registry to go on.
            try:
                value = self.serialize(i)
            except Exception as e:  # any client error: noted, tried again
                self.errors.append(repr(e))
                self.halt.wait(0.5)
                continue
            self.producer.produce(self.topic, key=f"o-{i}".encode(), value=value)
            self.sent.append(f"o-{i}")
            i += 1
            self.producer.poll(0)
            self.halt.wait(0.02)
        assert self.producer.flush(30) == 0


def test_the_registry_stopped_for_30_s_under_load_is_waited_out(
    kafka_bootstrap: str, database_url: str, private_registry: PrivateRegistry, tmp_path: Path
) -> None:
    d = Deployment(kafka_bootstrap, database_url, private_registry.url, tmp_path / "run.log")
    # The killed replica's group session ends within this, so its successor is assigned while
    # the registry is still away (the default, 45 s, would outlast the outage).
    d.env["SAGA_CONSUMER__SESSION_TIMEOUT"] = "6s"
    # Bounded, as the processor's client is: a call the registry never answers fails the
    # partner in seconds instead of holding its thread (and the test) for good.
    registry = SchemaRegistryClient({"url": private_registry.url, "timeout": 5})
    partner = Partner(kafka_bootstrap, registry, d.topic(ra.AVRO_EVENTS))
    try:
        d.start()
        partner.thread.start()
        try:
            wait_until(lambda: d.ended() >= 50, 90, "the first sagas ended")
        except AssertionError as e:
            raise AssertionError(
                f"{e}; the partner sent {len(partner.sent)}, its registry errors: "
                f"{partner.errors[-3:]}"
            ) from e
        # The partner's next version, registered now and sent once the registry is away: the
        # processor meets its id only then.
        partner.register_next_version()
        stopped = time.monotonic()
        private_registry.down()
        partner.use_v2 = True
        ended_at_stop = d.ended()
        # A third of the way through the outage the replica is killed, and one that has
        # fetched nothing takes its partitions (its session ends in seconds: see the settings).
        wait_until(lambda: time.monotonic() - stopped >= OUTAGE_S / 3, OUTAGE_S, "a third in")
        d.kill()
        d.start()
        wait_until(lambda: time.monotonic() - stopped >= OUTAGE_S, OUTAGE_S, "the outage's end")
        during = d.ended()
        private_registry.up()
        partner.halt.set()
        partner.thread.join(60)
        total = len(partner.sent)

        wait_until(lambda: d.ended() == total, 180, f"all {total} sagas ended")
        answered = query(d.database_url, d.service, "SELECT ask_id, amount FROM answered")
        dead = query(d.database_url, d.schema, "SELECT count(*) FROM dead_letter")
        doubled = query(
            d.database_url,
            d.schema,
            "SELECT saga_id, message_id, count(*) FROM saga_history "
            "GROUP BY saga_id, message_id HAVING count(*) > 1",
        )
    finally:
        partner.halt.set()
        registry.close()
        try:
            d.stop()
        finally:
            d.drop()
    log = (tmp_path / "run.log").read_text()
    # Nothing read with the new schema could be handled while the registry was away.
    assert during < total
    assert ended_at_stop <= during
    assert "waiting for the schema registry" in log
    assert "schema registry answers again" in log
    # Nothing lost, nothing applied twice, nothing dead-lettered.
    assert sorted(a for a, _ in answered) == sorted(partner.sent)
    assert all(amount == int(a.split("-")[1]) for a, amount in answered)
    assert dead == [(0,)]
    assert doubled == []
