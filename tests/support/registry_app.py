"""A saga and its participant over registry-framed topics (tests/integration/test_registry_*).

Events come in as JSON Schema and Avro from producers that send no headers of ours, the saga's
commands go out in Avro, and the participant answers in Protobuf.
"""

from __future__ import annotations

import json

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

EVENTS, AVRO_EVENTS, COMMANDS, REPLIES = (
    "reg-events",
    "reg-avro-events",
    "reg-commands",
    "reg-replies",
)
DEAD_LETTERS = "saga-dead-letters"
TOPICS = (EVENTS, AVRO_EVENTS, COMMANDS, REPLIES, DEAD_LETTERS)

FORMATS = {
    EVENTS: "json-schema",
    AVRO_EVENTS: {"format": "avro", "id_field": "ask_id"},
    COMMANDS: "avro",
    REPLIES: "protobuf",
}
"""`SAGA_SCHEMA_REGISTRY__TOPICS` of the app."""

# What a partner's producer registers: its own names, no headers of ours.
PARTNER_JSON_SCHEMA = json.dumps(
    {
        "title": "Asked",
        "type": "object",
        "properties": {"ask_id": {"type": "string"}, "amount": {"type": "integer"}},
        "required": ["ask_id", "amount"],
    }
)
PARTNER_AVRO_SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "AskedAvro",
        "namespace": "partner.shop",
        "fields": [{"name": "ask_id", "type": "string"}, {"name": "amount", "type": "long"}],
    }
)
# The same, a version later: a field added with a default (compatible both ways).
PARTNER_AVRO_SCHEMA_V2 = json.dumps(
    {
        "type": "record",
        "name": "AskedAvro",
        "namespace": "partner.shop",
        "fields": [
            {"name": "ask_id", "type": "string"},
            {"name": "amount", "type": "long"},
            {"name": "channel", "type": "string", "default": "web"},
        ],
    }
)


@message_type("tests.reg.Asked", topic=EVENTS)
class Asked(Message):
    ask_id: str
    amount: int


@message_type("tests.reg.AskedAvro", topic=AVRO_EVENTS)
class AskedAvro(Message):
    ask_id: str
    amount: int


@message_type("tests.reg.Answer", topic=COMMANDS)
class Answer(Message):
    ask_id: str
    amount: int
    note: str | None = None


@message_type("tests.reg.Answered", topic=REPLIES)
class Answered(Message):
    ask_id: str
    total: int


@saga(type="reg-ask")
class AskSaga(SagaState):
    @saga_event_handler(Asked, association_property="ask_id", start=True)
    def asked(self, event: Asked, commands: SagaCommands) -> None:
        commands.send(Answer(ask_id=event.ask_id, amount=event.amount))

    @saga_event_handler(AskedAvro, association_property="ask_id", start=True)
    def asked_avro(self, event: AskedAvro, commands: SagaCommands) -> None:
        commands.send(Answer(ask_id=event.ask_id, amount=event.amount, note="avro"))

    @saga_event_handler(Answered, association_property="ask_id")
    def answered(self, event: Answered, lifecycle: SagaLifecycle) -> None:
        lifecycle.end()


@participant(name="reg-answerer")
class Answerer:
    @command_handler()
    def answer(self, command: Answer, replies: Replies, sql: Sql) -> None:
        sql.execute("INSERT INTO answered VALUES (%s, %s)", (command.ask_id, command.amount))
        replies.send(Answered(ask_id=command.ask_id, total=command.amount * 2))


app = SagaApp(
    sagas=[AskSaga],
    participants=[Answerer],
    participant_migrations=["CREATE TABLE answered (ask_id text PRIMARY KEY, amount bigint)"],
)
