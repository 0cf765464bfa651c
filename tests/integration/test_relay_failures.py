"""The relay against real Kafka and PostgreSQL when some rows cannot be published.

An oversized command and a command to a topic that does not exist both end in the failed
outbox with their reason, their sagas' later rows held behind them, while 1,000 other sagas'
commands arrive in order meanwhile; once the topic exists, `retry` publishes the held rows in
order. A dead letter of a near-1 MB input goes out cut to fit. Both claim paths run it:
rows of no input partition (one relay at a time) and rows claimed by the replica that owns
their input partition.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from processor._cli import main
from processor._kafka.producer import KafkaRecordProducer, make_producer, relay_overrides
from processor._postgres.connect import connect, ensure_schema
from processor._postgres.failed_outbox import PostgresFailedOutbox
from processor._postgres.outbox import PostgresOutboxStore
from processor._postgres.schema.tables import Tables
from processor._runtime.relay import HEADER_DEAD_LETTER_TRUNCATED, Relay
from processor.ops._outbox import retry_failed_rows
from tests.support.harness import Reader, create_topics, wait_until

pytestmark = pytest.mark.integration

SAGAS = 1000


GROUP = "relay-failures"
SOURCE = "transfer-events"
PARTITIONS = 3


@pytest.fixture(params=["no-partition", "owned-partitions"])
def relay_env(
    kafka_bootstrap: str, database_url: str, pg_schema: str, request: pytest.FixtureRequest
) -> Iterator[tuple[Tables, Relay, bool]]:
    """A relay over rows of no input partition (one relay at a time), or over rows that carry
    the input partition that caused them, claimed by the replica that owns it."""
    owned = request.param == "owned-partitions"
    tables = Tables(schema=pg_schema)
    ensure_schema(database_url, tables)
    if owned:
        with connect(database_url, autocommit=True) as admin:
            admin.execute(
                tables.render(
                    "INSERT INTO {offsets} (group_id, topic, partition, next_offset, owner_epoch,"
                    " owner) SELECT %s, %s, p, NULL, 1, 'me' FROM generate_series(0, %s) AS p"
                ),
                (GROUP, SOURCE, PARTITIONS - 1),
            )
    relay = Relay(
        PostgresOutboxStore(lambda: connect(database_url), tables, GROUP if owned else None),
        KafkaRecordProducer(
            lambda: make_producer(
                {"bootstrap.servers": kafka_bootstrap},
                partitioner="crc32",
                **relay_overrides(1_000_000),
            )
        ),
        batch_size=500,
        poll_interval=0.1,
        flush_timeout=20.0,
        owned=(lambda: {(SOURCE, p): 1 for p in range(PARTITIONS)}) if owned else None,
    )
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), name="relay", daemon=True)
    thread.start()
    try:
        yield tables, relay, owned
    finally:
        stop.set()
        relay.wake.set()
        thread.join(30)
        relay.close()
    assert not thread.is_alive()


def test_unpublishable_rows_are_set_aside_while_other_sagas_flow_and_retry_publishes_them(
    kafka_bootstrap: str,
    database_url: str,
    pg_schema: str,
    make_topic: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
    relay_env: tuple[Tables, Relay, bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # capsys comes before relay_env so the relay stops before capture closes stderr.
    tables, relay, owned = relay_env
    commands = make_topic("commands", partitions=3)
    dead = make_topic("dead")
    missing = f"{commands}.missing-{uuid.uuid4().hex[:6]}"
    insert = tables.render(
        "INSERT INTO {outbox} (saga_type, saga_id, topic, key, headers, value, source_topic,"
        " source_partition) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
    )

    def row(saga: str | None, n: int, topic: str, value: bytes = b"", **h: str) -> tuple[Any, ...]:
        headers = {"message-id": f"{saga}-{n}", **h}
        key = (saga or "dl").encode()
        # A saga's rows all come from the input partition its events are keyed to.
        source = (SOURCE, sum(key) % PARTITIONS) if owned else (None, None)
        saga_type = "transfer" if saga else None
        return (saga_type, saga, topic, key, Jsonb(headers), value or b"v", *source)

    with connect(database_url, autocommit=True) as admin:
        admin.cursor().executemany(
            insert,
            [
                row("big", 1, commands, b"x" * 1_100_000),
                row("lost", 1, missing),
                *(row(f"s{i}", 1, commands) for i in range(SAGAS // 2)),
                row("big", 2, commands),
                row("lost", 2, commands),
                row(None, 1, dead, b"y" * 1_040_000, **{"dead-letter-reason": "too-large"}),
                *(row(f"s{i}", 1, commands) for i in range(SAGAS // 2, SAGAS)),
                *(row(f"s{i}", 2, commands) for i in range(SAGAS)),
                row("lost", 3, commands),
            ],
        )
        relay.wake.set()
        failed = PostgresFailedOutbox(admin, tables)

        reader = Reader(kafka_bootstrap, [commands, dead])
        try:
            reader.wait_for(lambda rs: len(rs) >= 2 * SAGAS + 1, what="every good command")
            per_saga: dict[str, list[str]] = {}
            for msg in reader.records:
                if msg.topic() == commands:
                    per_saga.setdefault(msg.key().decode(), []).append(
                        reader.headers(msg)["message-id"]
                    )
            assert per_saga == {f"s{i}": [f"s{i}-1", f"s{i}-2"] for i in range(SAGAS)}
            (letter,) = [m for m in reader.records if m.topic() == dead]
            assert reader.headers(letter)[HEADER_DEAD_LETTER_TRUNCATED] == "1040000"
            assert 0 < len(letter.value()) < 1_000_000

            wait_until(lambda: len(failed.list_failed()) == 5, what="five set-aside rows")
            rows = failed.list_failed()
            by_id = {r.row.headers["message-id"]: r for r in rows}
            assert [r.row.headers["message-id"] for r in rows] == [
                "big-1",
                "lost-1",
                "big-2",
                "lost-2",
                "lost-3",
            ]
            assert by_id["big-1"].reason.endswith("bytes over 1000000")
            assert "Unknown topic" in by_id["lost-1"].reason
            assert by_id["lost-1"].held_behind is None
            assert by_id["big-2"].held_behind == by_id["big-1"].id
            assert by_id["lost-2"].held_behind == by_id["lost-1"].id
            assert by_id["lost-3"].held_behind == by_id["lost-1"].id

            # The operator creates the topic, then retries the saga: its rows go out in order.
            create_topics(kafka_bootstrap, [missing])
            reader.follow([commands, dead, missing])
            back = retry_failed_rows(failed, saga_type="transfer", saga_id="lost")
            assert [b.row.headers["message-id"] for b in back] == ["lost-1", "lost-2", "lost-3"]
            relay.wake.set()

            def lost(rs: list[Any]) -> list[Any]:
                return [m for m in rs if m.key() == b"lost"]

            reader.wait_for(lambda rs: len(lost(rs)) >= 3, what="the retried saga")
            # Across topics, in the order produced: each only once the one before was acked.
            # Create times have millisecond resolution and a loopback ack can take less, so
            # two rows may share one; the order shows as times that never go back, and as
            # offsets within the topic the last two share.
            sent = {reader.headers(m)["message-id"]: m for m in lost(reader.records)}
            assert sorted(sent) == ["lost-1", "lost-2", "lost-3"]
            assert [sent[i].topic() for i in sorted(sent)] == [missing, commands, commands]
            times = [sent[i].timestamp()[1] for i in ("lost-1", "lost-2", "lost-3")]
            assert times == sorted(times)
            assert sent["lost-2"].partition() == sent["lost-3"].partition()
            assert sent["lost-2"].offset() < sent["lost-3"].offset()
            assert [r.row.headers["message-id"] for r in failed.list_failed()] == [
                "big-1",
                "big-2",
            ]
        finally:
            reader.close()
        count = admin.execute(tables.render("SELECT count(*) FROM {outbox}")).fetchone()
        assert count == (0,)

    # The operator's command line over the same tables: list, then discard with a reason.
    monkeypatch.setenv("SAGA_DATABASE__URL", database_url)
    monkeypatch.setenv("SAGA_DATABASE__SCHEMA_NAME", pg_schema)
    assert main(["outbox", "failed", "list", "--saga-type", "transfer", "--saga-id", "big"]) == 0
    capsys.readouterr()
    big = ["--saga-type", "transfer", "--saga-id", "big"]
    assert main(["outbox", "failed", "list", *big, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["action"] == "list"
    assert [r["row"]["headers"]["message-id"] for r in listed["rows"]] == ["big-1", "big-2"]
    assert listed["rows"][1]["held_behind"] == listed["rows"][0]["id"]
    assert main(["outbox", "failed", "discard", *big, "--reason", "sent by hand", "--json"]) == 0
    discarded = json.loads(capsys.readouterr().out)
    assert discarded["action"] == "discard"
    assert [r["id"] for r in discarded["rows"]] == [r["id"] for r in listed["rows"]]
    assert main(["outbox", "failed", "retry", "--id", "1"]) == 1
    with connect(database_url, autocommit=True) as admin:
        assert PostgresFailedOutbox(admin, tables).list_failed() == []
