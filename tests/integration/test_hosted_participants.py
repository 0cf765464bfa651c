"""A SagaApp that hosts its participants: one `saga-processor run` process for both halves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from processor import (
    Message,
    SagaApp,
    SagaCommands,
    SagaLifecycle,
    SagaState,
    message_type,
    saga,
    saga_event_handler,
)
from processor.participant import Replies, Sql, command_handler, participant
from tests.support.harness import Publisher, create_topics, query, wait_until
from tests.support.procs import REPO

pytestmark = pytest.mark.integration

EVENTS, COMMANDS = "hosted-events", "hosted-commands"


@message_type("tests.hosted.Asked", topic=EVENTS)
class Asked(Message):
    ask_id: str


@message_type("tests.hosted.Answer", topic=COMMANDS)
class Answer(Message):
    ask_id: str


@message_type("tests.hosted.Answered", topic=EVENTS)
class Answered(Message):
    ask_id: str


@saga(type="hosted-ask")
class AskSaga(SagaState):
    @saga_event_handler(Asked, association_property="ask_id", start=True)
    def asked(self, event: Asked, commands: SagaCommands) -> None:
        commands.send(Answer(ask_id=event.ask_id))

    @saga_event_handler(Answered, association_property="ask_id")
    def answered(self, event: Answered, lifecycle: SagaLifecycle) -> None:
        lifecycle.end()


@participant(name="answerer")
class Answerer:
    @command_handler()
    def answer(self, command: Answer, replies: Replies, sql: Sql) -> None:
        sql.execute("INSERT INTO answered VALUES (%s)", (command.ask_id,))
        replies.send(Answered(ask_id=command.ask_id))


app = SagaApp(
    sagas=[AskSaga],
    participants=[Answerer],
    participant_migrations=["CREATE TABLE answered (ask_id text PRIMARY KEY)"],
)


def test_the_processor_and_its_participants_run_in_one_process(
    kafka_bootstrap: str, database_url: str, tmp_path: Path
) -> None:
    prefix = f"h{uuid.uuid4().hex[:8]}."
    schema, service = f"h_{uuid.uuid4().hex[:8]}", f"hs_{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, [prefix + t for t in (EVENTS, COMMANDS, "saga-dead-letters")])
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "SAGA_APP": "tests.integration.test_hosted_participants:app",
            "SAGA_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
            "SAGA_DATABASE__URL": database_url,
            "SAGA_DATABASE__SCHEMA_NAME": schema,
            "SAGA_PARTICIPANT__SCHEMA_NAME": service,
            "SAGA_PARTICIPANT__GROUP_ID": f"{prefix}answerer",
            "SAGA_CONSUMER__GROUP_ID": f"{prefix}processor",
            "SAGA_TOPIC_PREFIX": prefix,
            "SAGA_METRICS__PORT": "0",
            "SAGA_RELAY__POLL_INTERVAL": "200ms",
        }
    )
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "processor", "run"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        publisher = Publisher(kafka_bootstrap)
        asks = [f"a-{i}" for i in range(5)]
        for ask in asks:
            publisher.event(prefix + EVENTS, ask, Asked(ask_id=ask))
        publisher.flush()

        def ended() -> bool:
            try:
                rows = query(
                    database_url,
                    schema,
                    "SELECT count(*) FROM saga_instance WHERE status = 'ended'",
                )
            except psycopg.Error:
                return False  # the schema is being made
            return rows == [(len(asks),)]

        wait_until(ended, 90, "every ask answered and ended")
        assert query(database_url, service, "SELECT count(*) FROM answered") == [(len(asks),)]
        assert "hosting participants" in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        with psycopg.connect(database_url, autocommit=True) as conn:
            for name in (schema, service):
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
