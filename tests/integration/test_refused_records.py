"""A hundred records the database refuses, in one batch of five hundred, cost no rebalance.

Against real Kafka and PostgreSQL: check constraints (as a database administrator might add)
refuse the writes of 100 sagas spread through a 500-record batch on one partition. The processor
finds them by trial writes that are rolled back. The 50 whose state the database refuses are
parked with its reason, their records held for a retry; the 50 whose very row it refuses (their
id) cannot even be parked, so their records are dead-lettered with the reason. The other 400
commit and the partition moves past all 500; the consumer keeps polling through the search, so
the group never takes the partition away.
"""

from __future__ import annotations

import logging
import re
import uuid

import psycopg
import pytest
from psycopg import sql

from processor import Message, SagaCommands, SagaState, message_type, saga, saga_event_handler
from processor._postgres.connect import ensure_schema
from processor._postgres.schema.tables import Tables
from tests.support.harness import Publisher, create_topics, query, running, settings_for, wait_until

pytestmark = pytest.mark.integration

EVENTS = "refused-test-events"
COMMANDS = "refused-test-commands"
RECORDS = 500
REFUSED = 100


@message_type("tests.refused.Open", topic=EVENTS)
class Open(Message):
    box_id: str


@message_type("tests.refused.Opened", topic=COMMANDS)
class Opened(Message):
    box_id: str


@saga(type="refused-test-box")
class BoxSaga(SagaState):
    box_id: str = ""

    @saga_event_handler(Open, association_property="box_id", start=True)
    def open(self, event: Open, commands: SagaCommands) -> None:
        self.box_id = event.box_id
        commands.send(Opened(box_id=event.box_id))


def test_a_hundred_refused_records_in_a_batch_of_five_hundred_are_isolated_without_a_rebalance(
    kafka_bootstrap: str, database_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    create_topics(
        kafka_bootstrap, [prefix + EVENTS, prefix + COMMANDS, prefix + "saga-dead-letters"]
    )
    ensure_schema(database_url, Tables(pg_schema))
    with psycopg.connect(database_url, autocommit=True) as conn:
        for constraint in (
            "no_refused CHECK (saga_id NOT LIKE 'refused-%%')",
            "no_held CHECK (state IS NULL OR state->>'box_id' NOT LIKE 'held-%%')",
        ):
            conn.execute(
                sql.SQL("ALTER TABLE {}.saga_instance ADD CONSTRAINT " + constraint).format(
                    sql.Identifier(pg_schema)
                )
            )
    # Every fifth saga is refused, by one constraint or the other; all 500 records are on the
    # topic before the processor reads, and it waits for a full batch.
    ids = [
        (f"refused-{i}" if i % 10 == 2 else f"held-{i}") if i % 5 == 2 else f"box-{i}"
        for i in range(RECORDS)
    ]
    pub = Publisher(kafka_bootstrap)
    for box in ids:
        pub.event(prefix + EVENTS, box, Open(box_id=box))
    pub.flush()
    settings = settings_for(
        kafka_bootstrap,
        database_url,
        pg_schema,
        prefix,
        consumer={"batch_size": RECORDS, "batch_timeout": "5s"},
    )
    caplog.set_level(logging.INFO, logger="processor._runtime")
    with running(settings, [BoxSaga]):
        wait_until(
            lambda: (
                query(database_url, pg_schema, "SELECT next_offset FROM consumer_offset")
                == [(RECORDS,)]
            ),
            timeout=120,
            what="the partition's stored position past all 500 records",
        )
        revoked = [r.message for r in caplog.records if r.message.startswith("revoked")]
        assigned = [r.message for r in caplog.records if r.message.startswith("assigned")]
    assert revoked == [], revoked
    assert len(assigned) == 1, assigned

    [summary] = [r.message for r in caplog.records if "trial writes (" in r.message]
    found = re.search(
        r"batch of (\d+) records: the database refused the writes of (\d+) saga\(s\), parked, "
        r"and (\d+) record\(s\), dead-lettered; found in (\d+) trial writes",
        summary,
    )
    assert found is not None, summary
    size, parked, dead, trials = map(int, found.groups())
    assert (size, parked, dead) == (RECORDS, REFUSED // 2, REFUSED // 2), summary
    # With the refused sagas evenly spread, every half down to about 100 sagas holds one: about
    # 100 x 2 (log2(500 / 100) + 1) = 664 small trial writes, plus one to try parking each
    # (733 measured). The plain bisection over prefixes took about 100 x (1 + log2(500))
    # = 1,000 writes of 250 records on average.
    assert trials <= 850, summary
    letters = query(
        database_url, pg_schema, 'SELECT key, reason, detail FROM dead_letter ORDER BY "offset"'
    )
    assert [bytes(k).decode() for k, _, _ in letters] == [b for b in ids if b.startswith("refused")]
    assert {r for _, r, _ in letters} == {"refused-by-database"}
    assert all("23514" in d for _, _, d in letters)
    rows = query(
        database_url, pg_schema, "SELECT saga_id, status, parked_reason FROM saga_instance"
    )
    assert {s for s, _, _ in rows} == {b for b in ids if not b.startswith("refused")}
    parked_rows = {s: r for s, status, r in rows if status == "parked"}
    assert set(parked_rows) == {b for b in ids if b.startswith("held")}
    assert set(parked_rows.values()) == {
        'the database refused its writes (23514: new row for relation "saga_instance" violates '
        'check constraint "no_held")'
    }
    held = query(database_url, pg_schema, "SELECT saga_id FROM parked_message")
    assert sorted(s for (s,) in held) == sorted(parked_rows)
