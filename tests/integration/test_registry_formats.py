"""Sagas over registry-framed topics, against a running Schema Registry, Kafka and PostgreSQL.

Partners publish with confluent-kafka's own serializers and none of our headers; a consumer of
theirs reads the saga's commands with its deserializer; the participant answers in Protobuf.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from processor._schemas.formats import frame_header
from processor.publish import EventPublisher
from processor.settings import SchemaRegistrySettings
from tests.support import registry_app as ra
from tests.support.harness import Reader, query, wait_until
from tests.support.registry_deploy import Deployment

pytestmark = pytest.mark.integration


@pytest.fixture
def deployment(
    kafka_bootstrap: str, database_url: str, schema_registry_url: str, tmp_path: Path
) -> Iterator[Deployment]:
    made = Deployment(kafka_bootstrap, database_url, schema_registry_url, tmp_path / "run.log")
    try:
        yield made
    finally:
        try:
            made.stop()
        finally:
            made.drop()


def _partner(kafka: str, registry: SchemaRegistryClient) -> tuple[Producer, Any, Any]:
    """A partner's producer and its own serializers (registering their schemas themselves)."""
    producer = Producer({"bootstrap.servers": kafka, "enable.idempotence": True})
    as_json = JSONSerializer(ra.PARTNER_JSON_SCHEMA, registry)
    as_avro = AvroSerializer(registry, ra.PARTNER_AVRO_SCHEMA)
    return producer, as_json, as_avro


@pytest.fixture
def registry(schema_registry_url: str) -> Iterator[SchemaRegistryClient]:
    """The partner's own registry client.

    With a timeout, as a partner's deployment would set one: the client has none by default,
    and in two runs of the parallel phase one of its requests (the serializer's per-record
    associations lookup) got no answer from the registry on a pooled connection and waited
    past the test's 180 s. Timed out, the client sends it again on a new connection.
    """
    client = SchemaRegistryClient({"url": schema_registry_url, "timeout": 10})
    try:
        yield client
    finally:
        client.close()


def test_a_saga_runs_on_partner_events_and_its_commands_read_with_their_deserializer(
    deployment: Deployment, kafka_bootstrap: str, registry: SchemaRegistryClient
) -> None:
    d = deployment
    registry_url = d.registry_url
    producer, as_json, as_avro = _partner(kafka_bootstrap, registry)
    events, avro_events = d.topic(ra.EVENTS), d.topic(ra.AVRO_EVENTS)
    # Bad input first, on the partitions the good events follow: each is dead-lettered with its
    # reason and none holds the partition up.
    producer.produce(events, key=b"bad-1", value=frame_header(2_000_000_000) + b"{}")
    known = as_avro(
        {"ask_id": "x", "amount": 1}, SerializationContext(avro_events, MessageField.VALUE)
    )
    producer.produce(avro_events, key=b"bad-2", value=known[:5] + b"\xff\xff\xff")
    d.start()
    jsons = [f"j-{i}" for i in range(4)]
    avros = [f"a-{i}" for i in range(4)]
    for ask in jsons:
        value = as_json(
            {"ask_id": ask, "amount": 5}, SerializationContext(events, MessageField.VALUE)
        )
        producer.produce(events, key=ask.encode(), value=value)
    for ask in avros:
        value = as_avro(
            {"ask_id": ask, "amount": 7}, SerializationContext(avro_events, MessageField.VALUE)
        )
        producer.produce(avro_events, key=ask.encode(), value=value)
    assert producer.flush(30) == 0
    # Our own publisher frames as the settings say, its headers beside the frame.
    ours = [f"p-{i}" for i in range(2)]
    settings = SchemaRegistrySettings(url=registry_url, topics={ra.EVENTS: "json-schema"})
    kafka = {"bootstrap.servers": kafka_bootstrap}
    with EventPublisher(kafka, topic_prefix=d.prefix, schema_registry=settings) as p:
        for ask in ours:
            p.publish(ra.Asked(ask_id=ask, amount=3), key=ask)
    everyone = len(jsons) + len(avros) + len(ours)

    wait_until(lambda: d.ended() == everyone, 120, "every ask answered and ended")
    answered = query(d.database_url, d.service, "SELECT ask_id, amount FROM answered")
    expected = [(a, 5) for a in jsons] + [(a, 7) for a in avros] + [(a, 3) for a in ours]
    assert sorted(answered) == sorted(expected)
    dead = query(
        d.database_url, d.schema, "SELECT key, reason, detail FROM dead_letter ORDER BY key"
    )
    assert [(bytes(k), r) for k, r, _ in dead] == [
        (b"bad-1", "unknown-schema"),
        (b"bad-2", "unparseable"),
    ]
    assert "schema id 2000000000 is not in the registry" in dead[0][2]

    # The commands, as a registry-aware consumer of the partner reads them: Avro under the
    # schema the relay registered, our headers beside the frame.
    commands = Reader(kafka_bootstrap, [d.topic(ra.COMMANDS)])
    try:
        records = commands.wait_for(lambda rs: len(rs) >= everyone, 30, "every command")
        deserialize = AvroDeserializer(registry)
        seen = {}
        for msg in records:
            body = deserialize(
                msg.value(), SerializationContext(d.topic(ra.COMMANDS), MessageField.VALUE)
            )
            seen[body["ask_id"]] = body
            assert commands.headers(msg)["message-type"] == "tests.reg.Answer"
    finally:
        commands.close()
    assert set(seen) == set(jsons) | set(avros) | set(ours)
    assert seen["a-0"] == {"ask_id": "a-0", "amount": 7, "note": "avro"}
    assert seen["j-0"] == {"ask_id": "j-0", "amount": 5, "note": None}
    subjects = registry.get_subjects()
    assert f"{d.topic(ra.COMMANDS)}-tests.reg.Answer" in subjects
    # The participant's replies: Protobuf, registered under their own subject.
    replies = Reader(kafka_bootstrap, [d.topic(ra.REPLIES)])
    try:
        reply = replies.wait_for(lambda rs: len(rs) >= 8, 30, "8 replies")[0]
    finally:
        replies.close()
    value = reply.value()
    assert value[0] == 0
    schema = registry.get_schema(int.from_bytes(value[1:5], "big"))
    assert schema.schema_type == "PROTOBUF"
    d.stop()


def test_a_partner_adds_a_field_under_load_and_every_saga_in_flight_finishes(
    deployment: Deployment, kafka_bootstrap: str, registry: SchemaRegistryClient
) -> None:
    d = deployment
    avro_events = d.topic(ra.AVRO_EVENTS)
    subject = f"{avro_events}-value"
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    v1 = AvroSerializer(registry, ra.PARTNER_AVRO_SCHEMA)
    v2 = AvroSerializer(registry, ra.PARTNER_AVRO_SCHEMA_V2)
    ctx = SerializationContext(avro_events, MessageField.VALUE)
    d.start()
    total, switch = 300, 150
    for i in range(total):
        body: dict[str, Any] = {"ask_id": f"e-{i}", "amount": i}
        if i == switch:
            # The partner's next deploy: the registry holds the subject to BACKWARD, and the
            # new version (a field with a default) passes it while sagas are in flight.
            registry.set_compatibility(subject_name=subject, level="BACKWARD")
        value = v1(body, ctx) if i < switch else v2({**body, "channel": "app"}, ctx)
        producer.produce(avro_events, key=f"e-{i}".encode(), value=value)
        if i % 50 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    assert len(registry.get_versions(subject)) == 2

    wait_until(lambda: d.ended() == total, 120, f"{total} sagas ended")
    answered = query(d.database_url, d.service, "SELECT count(*), sum(amount) FROM answered")
    assert answered == [(total, sum(range(total)))]
    assert query(d.database_url, d.schema, "SELECT count(*) FROM dead_letter") == [(0,)]
    d.stop()


def test_schemas_check_refuses_a_model_the_registry_would_refuse_before_the_deploy(
    deployment: Deployment, registry: SchemaRegistryClient
) -> None:
    d = deployment
    registered = d.cli("schemas", "register", "--json")
    assert registered.returncode == 0, registered.stderr
    rows = json.loads(registered.stdout)["schemas"]
    subjects = {r["subject"]: r for r in rows}
    answer = f"{d.topic(ra.COMMANDS)}-tests.reg.Answer"
    assert subjects[answer]["outcome"] == "registered"
    assert subjects[answer]["format"] == "avro"
    assert subjects[f"{d.topic(ra.REPLIES)}-tests.reg.Answered"]["format"] == "protobuf"
    assert subjects[f"{d.topic(ra.EVENTS)}-tests.reg.Asked"]["format"] == "json-schema"
    registry.set_compatibility(subject_name=answer, level="BACKWARD")

    # The same models again: each is found registered.
    again = d.cli("schemas", "check")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "REFUSED" not in again.stdout

    evolved = d.cli("schemas", "check", env={"SAGA_APP": "tests.support.registry_app_evolved:app"})
    assert evolved.returncode == 0, evolved.stdout + evolved.stderr
    assert f"compatible   {answer}  tests.reg.Answer v2" in evolved.stdout

    broken = d.cli("schemas", "check", env={"SAGA_APP": "tests.support.registry_app_broken:app"})
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert f"incompatible {answer}  tests.reg.Answer v2" in broken.stdout
    assert broken.stdout.rstrip().endswith("REFUSED")
    # The preflight check says the same, with the database and topics it checks beside.
    assert d.cli("migrate").returncode == 0
    preflight = d.cli(
        "check", "--skip-topics", env={"SAGA_APP": "tests.support.registry_app_broken:app"}
    )
    assert preflight.returncode == 1, preflight.stdout + preflight.stderr
    assert f"schema of tests.reg.Answer v2 under {answer}: incompatible" in preflight.stdout
    # Nothing was registered by a check.
    assert len(registry.get_versions(answer)) == 1
