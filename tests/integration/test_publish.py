"""The event publishers against real Kafka and PostgreSQL.

A published event carries every header the processor reads, is keyed by its saga's id, lands on
the partition the configured partitioner picks, and the processor's decoder takes it. A record
the broker refuses (too large, no such topic) is named by a flush, by topic and message id. The
outbox publisher's rows go out through the relay with the same headers, and only once the
caller's transaction commits.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from processor._authoring.definition import SagaState, saga, saga_event_handler
from processor._authoring.messages import Message, message_type, registry
from processor._engine.decode import Event, decode
from processor._engine.partitioner import Partitioner, partition_for
from processor._engine.records import Record
from processor._kafka.tracked import TrackedProducer
from processor.publish import EventPublisher, OutboxEventPublisher, OutboxRelay, PublishFailed
from processor.settings import RelaySettings
from tests.support.harness import Reader, query, wait_until

pytestmark = pytest.mark.integration

TOPIC = "publish-things"
PARTITIONS = 6
MAX_BYTES = 1_048_576
HEADERS = {"message-id", "message-type", "schema-version", "correlation-id", "occurred-at"}


@message_type("itest.publish.ThingHappened", topic=TOPIC)
class ThingHappened(Message):
    thing_id: str
    note: str = ""


@saga(type="itest-thing")
class ThingSaga(SagaState):
    @saga_event_handler(ThingHappened, association_property="thing_id", start=True)
    def happened(self, event: ThingHappened) -> None: ...


def _prefix(topic: str) -> str:
    """make_topic names a topic ``<test>.<suffix>``: the rest is this test's topic prefix."""
    return topic.removesuffix(TOPIC)


def _headers(msg: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in (msg.headers() or [])}


def _record(msg: Any) -> Record:
    return Record(
        msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), tuple(msg.headers())
    )


def _read(kafka: str, topic: str, ids: set[str]) -> dict[str, Any]:
    """The records of ``topic`` with these message ids, by id, once all of them arrived."""
    reader = Reader(kafka, [topic])
    try:
        found = reader.wait_for(
            lambda rs: ids <= {_headers(m).get("message-id") for m in rs},
            timeout=60,
            what=f"{len(ids)} published events",
        )
        return {_headers(m)["message-id"]: m for m in found}
    finally:
        reader.close()


@pytest.mark.parametrize("partitioner", ["crc32", "murmur2"])
def test_an_event_has_every_header_its_key_and_its_partitioners_partition(
    kafka_bootstrap: str, make_topic: Callable[..., str], partitioner: Partitioner
) -> None:
    topic = make_topic(TOPIC, partitions=PARTITIONS)
    things = [f"thing-{i}-{uuid.uuid4().hex[:6]}" for i in range(24)]
    traced = SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    with EventPublisher(
        {"bootstrap.servers": kafka_bootstrap},
        partitioner=partitioner,
        topic_prefix=_prefix(topic),
        sagas=[ThingSaga],
    ) as publisher:
        ids = {publisher.publish(ThingHappened(thing_id=t)): t for t in things[1:]}
        with trace.use_span(NonRecordingSpan(traced)):
            ids[publisher.publish(ThingHappened(thing_id=things[0]), causation_id="c-0")] = things[
                0
            ]

    records = _read(kafka_bootstrap, topic, set(ids))
    for message_id, thing in ids.items():
        msg = records[message_id]
        headers = _headers(msg)
        assert set(headers) >= HEADERS, headers
        assert headers["message-type"] == "itest.publish.ThingHappened"
        assert headers["schema-version"] == "1"
        assert headers["correlation-id"] == message_id
        assert msg.key() == thing.encode()
        assert msg.partition() == partition_for(thing.encode(), PARTITIONS, partitioner)
        decoded = decode(_record(msg), registry, MAX_BYTES)
        assert isinstance(decoded, Event), decoded
        assert decoded.message == ThingHappened(thing_id=thing)
        assert decoded.metadata.message_id == message_id
        assert decoded.metadata.occurred_at is not None
    first = _headers(records[next(i for i, t in ids.items() if t == things[0])])
    assert first["causation-id"] == "c-0"
    assert first["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_from_settings_reads_the_processors_environment(
    kafka_bootstrap: str, make_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = make_topic(TOPIC, partitions=PARTITIONS)
    for name in list(os.environ):
        if name.startswith("SAGA_") and not name.startswith("SAGA_TEST_"):
            monkeypatch.delenv(name)
    # No SAGA_DATABASE__URL: a publisher needs no database.
    monkeypatch.setenv("SAGA_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("SAGA_CONSUMER__PARTITIONER", "murmur2")
    monkeypatch.setenv("SAGA_TOPIC_PREFIX", _prefix(topic))
    monkeypatch.setenv("SAGA_SAGAS", f'["{__name__}:ThingSaga"]')
    with EventPublisher.from_settings() as publisher:
        assert publisher.partitioner == "murmur2"
        sent = {publisher.publish(ThingHappened(thing_id=f"env-{i}")): f"env-{i}" for i in range(8)}
    records = _read(kafka_bootstrap, topic, set(sent))
    for message_id, thing in sent.items():
        assert records[message_id].partition() == partition_for(
            thing.encode(), PARTITIONS, "murmur2"
        )


def _limit_record_size(kafka: str, topic: str, limit: int) -> None:
    admin = AdminClient({"bootstrap.servers": kafka})
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)

    def applied() -> bool:
        described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
        entries = next(iter(described.values())).result(30)
        return bool(entries["max.message.bytes"].value == str(limit))

    wait_until(applied, timeout=30, what="the topic's record size limit")


def test_records_the_broker_refuses_are_named_by_flush_and_the_publisher_goes_on(
    kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(TOPIC)
    _limit_record_size(kafka_bootstrap, topic, 20_000)
    secret = "confidential-" * 4_000  # about 52 kB: over the topic's limit
    publisher = EventPublisher(
        {"bootstrap.servers": kafka_bootstrap}, topic_prefix=_prefix(topic), sagas=[ThingSaga]
    )
    refused = publisher.publish(ThingHappened(thing_id="big", note=secret))
    with pytest.raises(PublishFailed) as caught:
        publisher.flush(30)
    [failure] = caught.value.failures
    assert (failure.topic, failure.message_id, failure.permanent) == (topic, refused, True)
    assert "too large" in failure.reason.lower()
    assert f"{topic} message-id {refused}" in str(caught.value)
    assert "confidential" not in str(caught.value)

    # Over the client's own limit (message.max.bytes, 1 MB): refused before it leaves.
    huge = publisher.publish(ThingHappened(thing_id="huge", note="x" * 1_200_000))
    absent = f"{_prefix(topic)}absent-{uuid.uuid4().hex[:8]}"
    missing = publisher.publish(ThingHappened(thing_id="lost"), topic=absent)
    with pytest.raises(PublishFailed) as caught:
        publisher.flush(30)
    assert [(f.topic, f.message_id, f.permanent) for f in caught.value.failures] == [
        (topic, huge, True),
        (absent, missing, True),
    ]
    assert "unknown topic" in caught.value.failures[1].reason.lower()
    assert absent in str(caught.value)

    # Nothing stays broken: the next event goes out, and a flush reports each failure once.
    fine = publisher.publish(ThingHappened(thing_id="fine"))
    publisher.close()
    assert set(_read(kafka_bootstrap, topic, {fine})) == {fine}


def test_outbox_events_go_out_through_the_relay_once_committed(
    kafka_bootstrap: str, database_url: str, pg_schema: str, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(TOPIC, partitions=3)
    outbox = OutboxEventPublisher(pg_schema, topic_prefix=_prefix(topic), sagas=[ThingSaga])
    relay = OutboxRelay(
        kafka={"bootstrap.servers": kafka_bootstrap},
        database_url=database_url,
        schema=pg_schema,
        settings=RelaySettings(poll_interval="200ms"),
    )
    things = f'"{pg_schema}".thing'  # the service's own table
    with psycopg.connect(database_url) as conn:
        outbox.migrate(conn)
        conn.execute(f"CREATE TABLE {things} (id text PRIMARY KEY)")
        conn.commit()
        with conn.transaction() as tx:
            conn.execute(f"INSERT INTO {things} VALUES ('gone')")
            rolled_back = outbox.publish(conn, ThingHappened(thing_id="gone"))
            raise psycopg.Rollback(tx)
        with conn.transaction():
            conn.execute(f"INSERT INTO {things} VALUES ('kept')")
            committed = outbox.publish(conn, ThingHappened(thing_id="kept"), causation_id="c-9")
            # Not committed yet: the relay sees nothing.
            assert relay.run_once() == 0
            [(stored,)] = conn.execute(f'SELECT headers FROM "{pg_schema}".outbox').fetchall()

    with relay:
        records = _read(kafka_bootstrap, topic, {committed})
        wait_until(
            lambda: query(database_url, pg_schema, "SELECT count(*) FROM outbox") == [(0,)],
            timeout=30,
            what="an empty outbox",
        )
    msg = records[committed]
    assert _headers(msg) == stored
    assert set(stored) >= HEADERS | {"causation-id"}
    assert msg.key() == b"kept"
    assert msg.partition() == partition_for(b"kept", 3, "crc32")
    assert isinstance(decode(_record(msg), registry, MAX_BYTES), Event)
    # The outbox is empty and held only the committed row: the rolled-back event never exists.
    assert rolled_back not in records
    assert query(database_url, pg_schema, "SELECT id FROM thing") == [("kept",)]

    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        pytest.raises(ValueError, match="autocommit"),
    ):
        outbox.publish(conn, ThingHappened(thing_id="alone"))


def test_a_flush_that_leaves_records_unacknowledged_replaces_the_producer(
    kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    """A producer can keep a partition's records queued for good (confluentinc/librdkafka#5430).

    The first producer here reaches no broker (nothing listens on its port), so its record stays
    queued the same way. The flush names it as not acknowledged and the next producer takes
    over: the record published again under its message id reaches the broker.
    """
    topic = make_topic("replaced")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{s.getsockname()[1]}"  # closed when the block ends
    addresses = iter([nowhere, kafka_bootstrap])
    tracked = TrackedProducer(lambda: Producer({"bootstrap.servers": next(addresses)}))
    first = tracked.producer
    tracked.produce(topic, b"k", b"v", {}, "m-1")
    [failed] = tracked.flush(1.0)
    assert (failed.topic, failed.message_id, failed.permanent) == (topic, "m-1", False)
    assert "not acknowledged within 1 s" in failed.reason
    assert tracked.producer is not first

    tracked.produce(topic, b"k", b"v", {}, "m-1")
    assert tracked.flush(30.0) == []
    reader = Reader(kafka_bootstrap, [topic])
    try:
        reader.wait_for(lambda records: len(records) == 1, timeout=30, what="the record")
    finally:
        reader.close()
