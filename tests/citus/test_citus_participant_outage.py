"""A participant service on tables by bucket while a Citus worker is stopped.

The commands whose buckets the running worker holds are handled and answered meanwhile; those
of the stopped worker's buckets wait, and are handled once it is back. Each command is handled
once (its inbox row), and every one is answered.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from processor._authoring.messages import Message, MessageRegistry, message_type
from processor._bootstrap.participant import ParticipantService
from processor._postgres.schema.buckets import read_layout
from processor.participant import Replies, command_handler, participant
from processor.publish import EventPublisher
from processor.settings import ConsumerSettings, RelaySettings
from tests.citus.test_citus_participant_buckets import workers as bucket_workers
from tests.citus.test_citus_worker_outage import local_workers, worker
from tests.support.harness import Reader, create_topics, query, wait_until

# It stops a node of the shared Citus cluster: no other test runs beside it.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.serial]

REG = MessageRegistry()
# As many buckets as the command topic's partitions: each partition's commands, and its stored
# position, on one bucket's worker.
BUCKETS = 6
EACH = 3


@message_type("po.Hold", topic="holds", registry=REG)
class Hold(Message):
    order_id: str


@message_type("po.Held", topic="held", registry=REG)
class Held(Message):
    order_id: str


@participant(name="holds")
class Holds:
    @command_handler
    def hold(self, command: Hold, replies: Replies) -> None:
        replies.send(Held(order_id=command.order_id))


@dataclass
class Service:
    prefix: str
    schema: str
    service: ParticipantService
    publisher: EventPublisher
    replies: Reader

    def send(self, key: str) -> str:
        mid = str(uuid.uuid4())
        self.publisher.publish(
            Hold(order_id=key),
            key=key,
            message_id=mid,
            topic=self.prefix + "holds",
            headers={"saga-type": "order-saga", "saga-id": key},
            correlation_id=key,
        )
        self.publisher.flush(30)
        return mid

    def answered(self) -> set[str]:
        return {self.replies.headers(m)["causation-id"] for m in self.replies.records}


@pytest.fixture
def service(kafka_bootstrap: str, citus_url: str) -> Iterator[Service]:
    prefix = f"c{uuid.uuid4().hex[:8]}."
    schema = f"t_pout_{prefix[1:-1]}"
    create_topics(kafka_bootstrap, [prefix + "holds"], partitions=BUCKETS)
    create_topics(kafka_bootstrap, [prefix + "held", prefix + "saga-dead-letters"])
    running = ParticipantService(
        [Holds()],
        kafka={"bootstrap.servers": kafka_bootstrap},
        database_url=citus_url,
        schema=schema,
        group_id=f"{prefix}holds",
        topic_prefix=prefix,
        consumer=ConsumerSettings(session_timeout="PT6S"),
        relay=RelaySettings(poll_interval="PT0.2S"),
        message_registry=REG,
        distributed="buckets",
        buckets=BUCKETS,
    )
    stop = threading.Event()
    thread = threading.Thread(target=running.run, args=(stop,), daemon=True)
    thread.start()
    s = Service(
        prefix,
        schema,
        running,
        EventPublisher({"bootstrap.servers": kafka_bootstrap}, registry=REG),
        Reader(kafka_bootstrap, [prefix + "held"]),
    )
    try:
        yield s
    finally:
        stop.set()
        thread.join(30)
        running.close()
        s.replies.close()
        s.publisher.close()
        with psycopg.connect(citus_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    assert not thread.is_alive()


def test_the_running_workers_commands_are_answered_while_the_other_is_stopped(
    citus_url: str, service: Service
) -> None:
    ports = local_workers(citus_url)
    with psycopg.connect(citus_url, autocommit=True) as conn:
        layout = read_layout(conn, service.schema)
        assert layout is not None
        homes = bucket_workers(conn, service.schema, layout)
    keys = [f"order-{i}" for i in range(200)]
    stopped = homes[layout.of_key(keys[0].encode())]
    held = [k for k in keys if homes[layout.of_key(k.encode())] == stopped][:EACH]
    going = [k for k in keys if homes[layout.of_key(k.encode())] != stopped][:EACH]
    assert len(held) == len(going) == EACH

    # Running and assigned before the worker stops: a first command answered.
    first = service.send(going[0])
    service.replies.wait_for(lambda _: first in service.answered(), what="the first reply")

    number = ports[int(stopped.rsplit(":", 1)[1])]
    worker("stop", number)
    try:
        waiting = {service.send(k) for k in held}
        answered = {service.send(k) for k in going}
        service.replies.wait_for(
            lambda _: answered <= service.answered(),
            timeout=30,
            what="replies to the running worker's commands while the other is stopped",
        )
        assert not waiting & service.answered()
    finally:
        worker("start", number)

    everything = {first} | waiting | answered
    service.replies.wait_for(
        lambda _: everything <= service.answered(), timeout=60, what="every reply"
    )
    assert service.answered() == everything
    inbox = query(citus_url, service.schema, "SELECT message_id, outcome FROM inbox")
    assert sorted(inbox) == sorted((mid, "handled") for mid in everything)
    wait_until(lambda: service.service.failing == 0, 30, what="a batch that committed")
