"""A handler that leaves a state no JSON encoder takes parks its saga, not the replica.

Against real Kafka and PostgreSQL, on one partition (so the bad sagas and the healthy ones share
batches): one saga stores bytes that are not UTF-8 in a ``bytes`` field, another a string with a
lone surrogate. Each is parked with a reason that names the problem without the value, its later
event waits behind it, and every other saga on the partition completes while the processor runs
on (before, the batch raised out of the consumer loop on every replica in turn).
"""

from __future__ import annotations

import uuid

import pytest

from processor import Message, SagaCommands, SagaState, message_type, saga, saga_event_handler
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

EVENTS = "unstorable-test-events"
COMMANDS = "unstorable-test-commands"


@message_type("tests.unstorable.Put", topic=EVENTS)
class Put(Message):
    blob_id: str
    text: str = ""
    raw: str = ""  # hex


@message_type("tests.unstorable.Touch", topic=EVENTS)
class Touch(Message):
    blob_id: str


@message_type("tests.unstorable.Stored", topic=COMMANDS)
class Stored(Message):
    blob_id: str


@saga(type="unstorable-test-blob")
class BlobSaga(SagaState):
    blob_id: str = ""
    text: str = ""
    data: bytes = b""
    touches: int = 0

    @saga_event_handler(Put, association_property="blob_id", start=True)
    def put(self, event: Put, commands: SagaCommands) -> None:
        self.blob_id = event.blob_id
        self.text = event.text.replace("SURROGATE", "\udc80")
        self.data = bytes.fromhex(event.raw)
        commands.send(Stored(blob_id=event.blob_id))

    @saga_event_handler(Touch, association_property="blob_id")
    def touch(self, event: Touch) -> None:
        # Leaves the bad value in place: the state the batch leaves stays unstorable.
        self.touches += 1


def test_unstorable_states_park_their_sagas_and_the_partition_flows(
    kafka_bootstrap: str, database_url: str, pg_schema: str
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    create_topics(
        kafka_bootstrap, [prefix + EVENTS, prefix + COMMANDS, prefix + "saga-dead-letters"]
    )
    settings = settings_for(kafka_bootstrap, database_url, pg_schema, prefix)
    pub = Publisher(kafka_bootstrap)
    stored = Reader(kafka_bootstrap, [prefix + COMMANDS])
    good = [f"g{i}" for i in range(20)]
    try:
        with running(settings, [BlobSaga]):
            for i, blob in enumerate(good):
                pub.event(prefix + EVENTS, blob, Put(blob_id=blob, raw="6869"))
                if i == 5:
                    pub.event(prefix + EVENTS, "bytes", Put(blob_id="bytes", raw="ff"))
                if i == 10:
                    pub.event(prefix + EVENTS, "text", Put(blob_id="text", text="SURROGATE"))
            # Their next events wait behind them.
            pub.event(prefix + EVENTS, "bytes", Touch(blob_id="bytes"))
            pub.event(prefix + EVENTS, "text", Touch(blob_id="text"))
            pub.flush()
            stored.wait_for(lambda rs: len(rs) >= len(good), what="every healthy saga's command")

            def parked() -> list[tuple[str, str]]:
                return [
                    (str(a), str(b))
                    for a, b in query(
                        database_url,
                        pg_schema,
                        "SELECT saga_id, reason FROM parked_message ORDER BY id",
                    )
                ]

            wait_until(lambda: len(parked()) == 4, what="both bad sagas and their next events")
    finally:
        stored.close()
    bad_bytes = "state cannot be stored as JSON: a bytes value is not valid UTF-8"
    bad_text = "state cannot be stored as JSON: a string holds a lone surrogate (not valid Unicode)"
    assert sorted(parked()) == sorted(
        [
            ("bytes", bad_bytes),
            ("text", bad_text),
            ("bytes", "behind a parked saga"),
            ("text", "behind a parked saga"),
        ]
    )
    statuses = dict(query(database_url, pg_schema, "SELECT saga_id, status FROM saga_instance"))
    assert statuses == {**dict.fromkeys(good, "active"), "bytes": "parked", "text": "parked"}
    assert {Stored.model_validate_json(m.value()).blob_id for m in stored.records} == set(good)
