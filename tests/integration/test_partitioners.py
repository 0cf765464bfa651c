"""One partitioner everywhere, against a real broker: this project's producers place keyed
records with ``SAGA_CONSUMER__PARTITIONER``; records another partitioner placed are counted and
logged by a running processor, and ``check`` names the partitioner that fits them."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer

from processor._bootstrap.adapters import tables_for
from processor._cli.preflight import check_from_settings
from processor._engine.partitioner import Partitioner, partition_for
from processor._kafka.producer import make_producer
from processor._postgres.connect import ensure_schema
from tests.integration.test_poison import EVENTS, Gate, TabOpened, TabV1
from tests.support.harness import (
    create_topics,
    headers_for,
    query,
    running,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 6
KEYS = [f"tab-{i}" for i in range(200)]


def _differ(n: int) -> list[str]:
    """Tab ids the two partitioners put on different partitions."""
    found = [
        k
        for k in (f"tab-{uuid.uuid4().hex[:8]}" for _ in range(50 * n))
        if partition_for(k.encode(), PARTITIONS, "crc32")
        != partition_for(k.encode(), PARTITIONS, "murmur2")
    ]
    return found[:n]


def _landed(kafka: str, topic: str, count: int) -> dict[bytes, int]:
    consumer = Consumer(
        {"bootstrap.servers": kafka, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    out: dict[bytes, int] = {}
    try:
        wait_until(
            lambda: (
                out.update(
                    (m.key() or b"", m.partition() or 0)
                    for m in consumer.consume(500, 0.5)
                    if not m.error()
                )
                or len(out) >= count
            ),
            timeout=60,
            what=f"{count} records read back",
        )
    finally:
        consumer.close()
    return out


@pytest.mark.parametrize("partitioner", ["crc32", "murmur2"])
def test_this_projects_producers_place_keys_with_the_configured_partitioner(
    kafka_bootstrap: str, make_topic: Callable[..., str], partitioner: Partitioner
) -> None:
    topic = make_topic("placed", partitions=12)
    producer = make_producer({"bootstrap.servers": kafka_bootstrap}, partitioner=partitioner)
    for key in KEYS:
        producer.produce(topic, key=key.encode(), value=b"v")
    assert producer.flush(30) == 0
    landed = _landed(kafka_bootstrap, topic, len(KEYS))
    assert landed == {k.encode(): partition_for(k.encode(), 12, partitioner) for k in KEYS}


def _publish(kafka: str, topic: str, tabs: list[str], client_partitioner: str | None) -> None:
    conf = {"bootstrap.servers": kafka}
    if client_partitioner is not None:
        conf["partitioner"] = client_partitioner
    producer = Producer(conf)
    for tab in tabs:
        event = TabOpened(tab_id=tab)
        headers: list[tuple[str, str | bytes | None]] = [*headers_for(event)]
        value = event.model_dump_json().encode()
        producer.produce(topic, key=tab.encode(), value=value, headers=headers)
    assert producer.flush(30) == 0


def test_a_processor_counts_and_logs_records_another_partitioner_placed(
    kafka_bootstrap: str, database_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"p{uuid.uuid4().hex[:8]}."
    events = prefix + EVENTS
    create_topics(kafka_bootstrap, [events], partitions=PARTITIONS)
    create_topics(kafka_bootstrap, [prefix + "saga-dead-letters"])
    settings = settings_for(kafka_bootstrap, database_url, pg_schema, prefix)  # crc32: default
    java, ours = _differ(20), _differ(20)
    with (
        caplog.at_level(logging.WARNING, logger="processor._runtime.consumer.placement"),
        running(settings, [TabV1], dependencies={Gate: Gate()}) as proc,
    ):
        _publish(kafka_bootstrap, events, ours, None)  # librdkafka's default partitioner
        _publish(kafka_bootstrap, events, java, "murmur2_random")  # a Java client's
        wait_until(
            lambda: query(database_url, pg_schema, "SELECT count(*) FROM saga_instance") == [(40,)],
            timeout=90,
            what="every tab started",
        )
        assert proc.worker is not None
        assert proc.worker.placement is not None
        assert proc.worker.placement.off_partition == {events: 20}
    lines = [
        r.getMessage() for r in caplog.records if "SAGA_CONSUMER__PARTITIONER" in r.getMessage()
    ]
    assert len(lines) == 1, lines
    assert "the murmur2 partitioner would put it there" in lines[0]
    assert any(f"saga_id={t} " in lines[0] for t in java)


@pytest.mark.parametrize("configured", ["crc32", "murmur2"])
def test_check_samples_keys_and_names_the_partitioner_that_fits(
    kafka_bootstrap: str, database_url: str, pg_schema: str, configured: Partitioner
) -> None:
    prefix = f"c{uuid.uuid4().hex[:8]}."
    events = prefix + EVENTS
    create_topics(kafka_bootstrap, [events], partitions=PARTITIONS)
    create_topics(kafka_bootstrap, [prefix + "saga-dead-letters"])
    settings = settings_for(
        kafka_bootstrap, database_url, pg_schema, prefix, consumer={"partitioner": configured}
    )
    ensure_schema(database_url, tables_for(settings))
    _publish(kafka_bootstrap, events, _differ(30), "murmur2_random")
    report = check_from_settings(settings, [TabV1], dependencies={Gate: Gate()})
    found = [p for p in report.problems if "sampled record keys" in p]
    assert report.counts["sampled keys"] == 30
    if configured == "murmur2":
        assert found == []
    else:
        [problem] = found
        assert f"topic {events!r}: 30 of 30 sampled record keys" in problem
        assert "every sampled key fits murmur2" in problem
