"""Run Python sagas over Kafka events with exactly-once effects in PostgreSQL.

This package's top level is the authoring API: saga classes, handler decorators, the handles
injected into handlers, and message declarations. It imports no Kafka or PostgreSQL client, so
saga and schema modules stay cheap to import and test. The in-memory test fixture lives in
:mod:`processor.testing`. The event publishers (:mod:`processor.publish`) need the clients: they
are imported on first use of their names.
"""

from typing import TYPE_CHECKING, Any

from processor.application import ParticipantApp, SagaApp
from processor.definition import (
    CancelRequest,
    DecisionRequest,
    SagaState,
    definition_of,
    saga,
    saga_cancel_handler,
    saga_deadline_handler,
    saga_decision_handler,
    saga_event_handler,
)
from processor.errors import (
    ConfigurationError,
    HandlerError,
    IllegalTransition,
    SagaDefinitionError,
    SagaError,
    UnknownMessageType,
)
from processor.handles import SagaCommands, SagaDeadlines, SagaLifecycle, SagaOutcome, Setting
from processor.messages import Message, MessageMetadata, message_type
from processor.messages import registry as message_registry
from processor.upcasting import event_upcaster, upcaster

if TYPE_CHECKING:
    from processor.publish import EventPublisher, OutboxEventPublisher, OutboxRelay, PublishFailed

_PUBLISHING = frozenset({"EventPublisher", "OutboxEventPublisher", "OutboxRelay", "PublishFailed"})

__all__ = [
    "CancelRequest",
    "ConfigurationError",
    "DecisionRequest",
    "EventPublisher",
    "HandlerError",
    "IllegalTransition",
    "Message",
    "MessageMetadata",
    "OutboxEventPublisher",
    "OutboxRelay",
    "ParticipantApp",
    "PublishFailed",
    "SagaApp",
    "SagaCommands",
    "SagaDeadlines",
    "SagaDefinitionError",
    "SagaError",
    "SagaLifecycle",
    "SagaOutcome",
    "SagaState",
    "Setting",
    "UnknownMessageType",
    "definition_of",
    "event_upcaster",
    "message_registry",
    "message_type",
    "saga",
    "saga_cancel_handler",
    "saga_deadline_handler",
    "saga_decision_handler",
    "saga_event_handler",
    "upcaster",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use: importing the package must not import the Kafka or Postgres clients.
    if name in _PUBLISHING:
        from processor import publish

        return getattr(publish, name)
    raise AttributeError(f"module 'processor' has no attribute {name!r}")
