"""Test kits for saga and participant authors: in-memory, virtual time, the real planner.

``SagaFixture`` (:mod:`processor.testing._saga`) drives a saga through the engine's own planner
over the in-memory store (:mod:`processor.testing._engine`); ``ParticipantFixture``
(:mod:`processor.testing._participant`) runs a participant's command handlers over SQLite.
"""

from processor.testing._participant import (
    DeadLettered,
    ParticipantFixture,
    ParticipantResult,
    SentReply,
)
from processor.testing._saga import DEFAULT_START_TIME, Result, SagaFixture

__all__ = [
    "DEFAULT_START_TIME",
    "DeadLettered",
    "ParticipantFixture",
    "ParticipantResult",
    "Result",
    "SagaFixture",
    "SentReply",
]
