"""Bad input is dead-lettered with its reason and source, and never blocks its partition."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

import pytest

from sagas.transfer import TransferSaga
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC, TransferRequested
from tests.support.harness import (
    Publisher,
    Reader,
    create_topics,
    headers_for,
    query,
    running,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.integration

DEAD_LETTERS = "saga-dead-letters"
MAX_RECORD_BYTES = 1024


def _requested(tid: str, source: str = "A") -> TransferRequested:
    return TransferRequested(
        transfer_id=tid, source_account_id=source, target_account_id="B", amount=Decimal("10.00")
    )


def _json(message: TransferRequested) -> bytes:
    return message.model_dump_json().encode()


def test_each_kind_of_bad_input_is_dead_lettered_and_the_partition_keeps_flowing(
    kafka_bootstrap: str, database_url: str, pg_schema: str
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    events = prefix + TRANSFER_EVENTS_TOPIC
    # One partition: every bad record sits in front of the good one in the same log.
    create_topics(kafka_bootstrap, [events, prefix + ACCOUNT_COMMANDS_TOPIC, prefix + DEAD_LETTERS])
    settings = settings_for(
        kafka_bootstrap,
        database_url,
        pg_schema,
        prefix,
        consumer={"max_record_bytes": MAX_RECORD_BYTES},
    )
    good = _requested("tr-good")
    valid = headers_for(good)
    no_id = [(k, v) for k, v in headers_for(good) if k != "message-id"]
    unknown = [
        (k, b"transfers.NoSuchEvent" if k == "message-type" else v) for k, v in headers_for(good)
    ]
    missing_amount = json.loads(_json(good))
    del missing_amount["amount"]
    # (key, value, headers, expected reason), in publishing order.
    bad: list[tuple[bytes, bytes, list[tuple[str, bytes]], str]] = [
        (b"tr-1", b"\xff\xfe{not json", headers_for(good), "unparseable"),
        (b"tr-2", _json(good), unknown, "unknown-type"),
        (b"tr-3", json.dumps(missing_amount).encode(), headers_for(good), "schema-violation"),
        (b"tr-4", _json(_requested("tr-4", "A" * 2000)), headers_for(good), "oversized"),
        (b"tr-5", _json(_requested("")), headers_for(good), "missing-association"),
        (b"tr-6", _json(_requested("tr-6")), no_id, "missing-message-id"),
    ]
    dead = Reader(kafka_bootstrap, [prefix + DEAD_LETTERS])
    commands = Reader(kafka_bootstrap, [prefix + ACCOUNT_COMMANDS_TOPIC])
    pub = Publisher(kafka_bootstrap)
    try:
        with running(settings, [TransferSaga]):
            for key, value, headers, _reason in bad:
                pub.raw(events, key, value, headers)
            pub.raw(events, b"tr-good", _json(good), valid)
            pub.flush()
            dead.wait_for(lambda rs: len(rs) >= len(bad), timeout=90, what="dead letters")
            commands.wait_for(lambda rs: len(rs) >= 1, timeout=90, what="the good event's command")
            wait_until(
                lambda: (
                    query(
                        database_url,
                        pg_schema,
                        "SELECT next_offset FROM consumer_offset WHERE topic = %s",
                        events,
                    )
                    == [(len(bad) + 1,)]
                ),
                timeout=60,
                what="stored offset past every record",
            )
            wait_until(
                lambda: query(database_url, pg_schema, "SELECT count(*) FROM outbox") == [(0,)],
                what="relay drained the outbox",
            )
        expected = [reason for *_, reason in bad]
        heads = [dead.headers(m) for m in dead.records]
        assert [h["dead-letter-reason"] for h in heads] == expected
        assert [h["source-topic"] for h in heads] == [events] * len(bad)
        assert [h["source-partition"] for h in heads] == ["0"] * len(bad)
        assert [int(h["source-offset"]) for h in heads] == list(range(len(bad)))
        assert all(h["dead-letter-detail"] for h in heads)
        # The record itself travels unchanged, so it can be inspected and replayed.
        assert [(m.key(), m.value()) for m in dead.records] == [(k, v) for k, v, _, _ in bad]
        assert heads[1]["message-type"] == "transfers.NoSuchEvent"

        rows = query(
            database_url,
            pg_schema,
            'SELECT topic, partition, "offset", reason, key, detail FROM dead_letter ORDER BY id',
        )
        assert [(t, p, o, r, bytes(k)) for t, p, o, r, k, _ in rows] == [
            (events, 0, i, reason, key) for i, (key, _, _, reason) in enumerate(bad)
        ]
        assert str(MAX_RECORD_BYTES) in rows[3][5]
        assert "amount" in rows[2][5]

        # The good record behind them was applied once, and nothing bad reached saga state.
        assert query(database_url, pg_schema, "SELECT saga_id, status FROM saga_instance") == [
            ("tr-good", "active")
        ]
        assert [commands.headers(m)["message-type"] for m in commands.records] == [
            "transfers.DebitAccount"
        ]
    finally:
        dead.close()
        commands.close()
