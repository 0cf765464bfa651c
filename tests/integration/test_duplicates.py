"""Upstream duplicates apply once; events for missing or ended sagas are recorded and skipped."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from confluent_kafka import Consumer, TopicPartition

from processor.settings import ProcessorSettings
from sagas.transfer import TransferSaga
from schemas.transfers import (
    ACCOUNT_COMMANDS_TOPIC,
    TRANSFER_EVENTS_TOPIC,
    DebitConfirmed,
    DebitFailed,
    TransferRequested,
)
from tests.support.harness import (
    Publisher,
    Reader,
    create_topics,
    query,
    running,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.integration

TEN = Decimal("10.00")


@pytest.fixture
def setup(kafka_bootstrap: str, database_url: str, pg_schema: str) -> ProcessorSettings:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    topics = [prefix + TRANSFER_EVENTS_TOPIC, prefix + ACCOUNT_COMMANDS_TOPIC]
    create_topics(kafka_bootstrap, [*topics, prefix + "saga-dead-letters"], partitions=2)
    return settings_for(kafka_bootstrap, database_url, pg_schema, prefix)


def _requested(tid: str) -> TransferRequested:
    return TransferRequested(
        transfer_id=tid, source_account_id="A", target_account_id="B", amount=TEN
    )


def _history(settings: ProcessorSettings, tid: str) -> list[tuple[str, str, int | None]]:
    return [
        (m, o, v)
        for m, o, v in query(
            settings.database.url.get_secret_value(),
            settings.database.schema_name,
            "SELECT message_id, outcome, version FROM saga_history WHERE saga_id = %s ORDER BY id",
            tid,
        )
    ]


def _all_commands(settings: ProcessorSettings, commands: Reader) -> list[str]:
    """Every command the processor ever sent: the relay drained, the topic read to its end."""
    wait_until(lambda: _db(settings, "SELECT count(*) FROM outbox") == [(0,)], what="relay drained")
    topic = settings.topic_prefix + ACCOUNT_COMMANDS_TOPIC
    probe = Consumer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "group.id": f"probe-{uuid.uuid4().hex}",
        }
    )
    try:
        # No transactions write this topic, so the high watermarks count its records.
        meta = probe.list_topics(topic, timeout=30).topics[topic].partitions
        size = sum(
            probe.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in meta
        )
    finally:
        probe.close()
    commands.wait_for(lambda rs: len(rs) >= size, what=f"{size} commands")
    return [commands.headers(m)["message-type"] for m in commands.records]


def _db(settings: ProcessorSettings, sql: str, *args: object) -> list[tuple[object, ...]]:
    return query(
        settings.database.url.get_secret_value(), settings.database.schema_name, sql, *args
    )


def test_a_message_published_three_times_applies_once_across_a_restart(
    setup: ProcessorSettings,
) -> None:
    settings = setup
    events = settings.topic_prefix + TRANSFER_EVENTS_TOPIC
    commands = Reader(
        settings.kafka.bootstrap_servers, [settings.topic_prefix + ACCOUNT_COMMANDS_TOPIC]
    )
    pub = Publisher(settings.kafka.bootstrap_servers)
    tid = f"tr-{uuid.uuid4().hex[:6]}"
    debited = DebitConfirmed(transfer_id=tid, account_id="A", amount=TEN)
    try:
        with running(settings, [TransferSaga]):
            pub.event(events, tid, _requested(tid), "m-start")
            pub.event(events, tid, debited, "m-debited")
            pub.event(events, tid, debited, "m-debited")
            pub.flush()
            wait_until(lambda: len(_history(settings, tid)) >= 3, what="three history rows")
        with running(settings, [TransferSaga]):
            # A new offset, after a restart: only the stored history can recognise it.
            pub.event(events, tid, debited, "m-debited")
            pub.flush()
            wait_until(lambda: len(_history(settings, tid)) >= 4, what="the third copy recorded")
            sent = _all_commands(settings, commands)
        assert _history(settings, tid) == [
            ("m-start", "applied", 1),
            ("m-debited", "applied", 2),
            ("m-debited", "duplicate", None),
            ("m-debited", "duplicate", None),
        ]
        assert _db(settings, "SELECT version FROM saga_instance WHERE saga_id = %s", tid) == [(2,)]
        # The credit was requested once: a second apply would have sent it again.
        assert sent == ["transfers.DebitAccount", "transfers.CreditAccount"]
        # Every copy consumed (one saga, so one partition), none left to redo.
        assert _db(settings, "SELECT max(next_offset) FROM consumer_offset") == [(4,)]
    finally:
        commands.close()


def test_events_for_a_missing_or_ended_saga_are_recorded_and_skipped(
    setup: ProcessorSettings,
) -> None:
    settings = setup
    events = settings.topic_prefix + TRANSFER_EVENTS_TOPIC
    commands = Reader(
        settings.kafka.bootstrap_servers, [settings.topic_prefix + ACCOUNT_COMMANDS_TOPIC]
    )
    pub = Publisher(settings.kafka.bootstrap_servers)
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"
    tid = f"tr-{uuid.uuid4().hex[:6]}"
    try:
        with running(settings, [TransferSaga]):
            pub.event(events, ghost, DebitConfirmed(transfer_id=ghost, account_id="A", amount=TEN))
            pub.event(events, tid, _requested(tid), "m-start")
            pub.event(events, tid, DebitFailed(transfer_id=tid, account_id="A", reason="funds"))
            pub.event(
                events, tid, DebitConfirmed(transfer_id=tid, account_id="A", amount=TEN), "m-late"
            )
            pub.flush()
            wait_until(
                lambda: len(_history(settings, tid)) >= 3 and _history(settings, ghost),
                what="every event recorded",
            )
            sent = _all_commands(settings, commands)
        assert [(o, v) for _, o, v in _history(settings, ghost)] == [("no-saga", None)]
        history = _history(settings, tid)
        assert [(o, v) for _, o, v in history] == [
            ("applied", 1),
            ("applied", 2),
            ("ignored-ended", None),
        ]
        assert history[2][0] == "m-late"
        # The ghost left no saga behind; the ended saga kept its end state and cancelled its
        # deadline; the late event sent nothing.
        assert _db(settings, "SELECT saga_id, status, version FROM saga_instance") == [
            (tid, "ended", 2)
        ]
        assert _db(settings, "SELECT count(*) FROM saga_deadline") == [(0,)]
        assert sent == ["transfers.DebitAccount"]
    finally:
        commands.close()
