"""A participant service's consumer is assigned a partition added to its command topic at once.

Its metadata is refreshed every ``growth_check_interval`` (5 s by default), like a processor's,
not on librdkafka's five-minute default: so a grown command topic is consumed within seconds,
and a consumer that lost its group in a broker restart finds it again by its next refresh.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]

from processor._bootstrap.service import ServiceAdapters
from processor._ports.consumer import TP
from processor.settings import ConsumerSettings
from tests.support.harness import wait_until

pytestmark = pytest.mark.integration


def test_a_participant_consumer_is_assigned_a_partition_added_to_its_topic_within_seconds(
    kafka_bootstrap: str, database_url: str, make_topic: Callable[..., str]
) -> None:
    topic = make_topic("commands", partitions=1)
    settings = ConsumerSettings()  # the shipped defaults
    adapters = ServiceAdapters(
        kafka={"bootstrap.servers": kafka_bootstrap},
        partitioner=settings.partitioner,
        database_url=database_url,
        schema="unused_by_the_consumer",
        application_name="participant-growth",
        search_path=False,
    )
    assigned: set[TP] = set()

    def on_assign(tps: list[TP]) -> Mapping[TP, int | None]:
        assigned.update(tps)
        return {}

    consumer = adapters.consumers(settings)(f"{topic}.group", [topic], on_assign, lambda _: None)
    try:

        def has(partition: int) -> bool:
            consumer.consume(10, 0.2)
            return (topic, partition) in assigned

        wait_until(lambda: has(0), timeout=60, what="the first partition assigned")
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        for future in admin.create_partitions([NewPartitions(topic, 2)]).values():
            future.result()
        # Within a refresh interval and a rebalance; on the five-minute default this fails.
        wait_until(lambda: has(1), timeout=60, what="the added partition assigned")
    finally:
        consumer.close()
