"""The registry app with its command at version 2: a field added with a default: compatible."""

from __future__ import annotations

from processor import Message, SagaApp, message_type
from tests.support import registry_app as base


@message_type("tests.reg.Answer", version=2, topic=base.COMMANDS)
class AnswerV2(Message):
    ask_id: str
    amount: int
    note: str | None = None
    priority: int = 0


app = SagaApp(
    sagas=[base.AskSaga],
    participants=[base.Answerer],
    participant_migrations=base.app.participant_migrations,
)
