"""A replica fenced by another's claim learns it without input, against real Kafka and PostgreSQL.

A replica paused past its session may claim a partition of its stale assignment before its next
poll tells it the partition is gone: the rightful owner's epoch is bumped behind its back. With
no more input on that partition it would never commit there, so never learn it; its committed
outbox rows of the partition, fenced as well, would wait unpublished. The worker reads its
partitions' epochs every FENCE_CHECK seconds, gives up those bumped and claims them again.
"""

from __future__ import annotations

import uuid

import pytest
from psycopg.types.json import Jsonb

from processor._postgres.batch.store import BatchSql
from processor._postgres.connect import connect
from processor._postgres.schema.tables import Tables
from processor._runtime.consumer.worker import FENCE_CHECK
from processor.settings import ProcessorSettings
from sagas.transfer import TransferSaga
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC
from tests.support.harness import Reader, create_topics, query, running, settings_for, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def setup(kafka_bootstrap: str, database_url: str, pg_schema: str) -> ProcessorSettings:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    topics = [prefix + TRANSFER_EVENTS_TOPIC, prefix + ACCOUNT_COMMANDS_TOPIC]
    create_topics(kafka_bootstrap, [*topics, prefix + "saga-dead-letters"], partitions=1)
    return settings_for(kafka_bootstrap, database_url, pg_schema, prefix)


def test_a_replica_fenced_with_no_input_claims_again_and_publishes_its_rows(
    setup: ProcessorSettings,
) -> None:
    settings = setup
    url = settings.database.url.get_secret_value()
    schema = settings.database.schema_name
    tables = Tables(schema)
    group = settings.consumer.group_id
    events = settings.topic_prefix + TRANSFER_EVENTS_TOPIC
    commands = settings.topic_prefix + ACCOUNT_COMMANDS_TOPIC
    tp = (events, 0)

    def owner_and_epoch() -> tuple[str, int] | None:
        rows = query(
            url,
            schema,
            "SELECT owner, owner_epoch FROM consumer_offset WHERE group_id = %s AND topic = %s",
            group,
            events,
        )
        return (str(rows[0][0]), int(rows[0][1])) if rows else None

    reader = Reader(settings.kafka.bootstrap_servers, [commands])
    with running(settings, [TransferSaga]):
        claimed = wait_until(owner_and_epoch, 60, "the processor's claim")
        assert claimed is not None
        mine = claimed[0]
        # Another replica's claim behind the owner's back; then a row of the partition in the
        # outbox, as the owner committed it: its relay, fenced, cannot take it.
        with connect(url) as conn:
            zombie = BatchSql(conn, tables, group).claim([tp], "zombie")[tp][0]
        with connect(url) as conn, conn.transaction():
            conn.execute(
                tables.render(
                    "INSERT INTO {outbox} (saga_type, saga_id, topic, key, headers, value,"
                    " source_topic, source_partition) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                ),
                (
                    "transfer-saga",
                    "tr-fenced",
                    commands,
                    b"tr-fenced",
                    Jsonb({"message-id": "fenced-row"}),
                    b"{}",
                    events,
                    0,
                ),
            )
        # No input comes: only the epoch check tells the owner, within FENCE_CHECK.
        reader.wait_for(
            lambda rs: any(reader.headers(r).get("message-id") == "fenced-row" for r in rs),
            timeout=FENCE_CHECK + 30,
            what="the row of the fenced partition published",
        )
        now = owner_and_epoch()
        assert now is not None
        assert now[0] == mine
        assert now[1] > zombie
    reader.close()
