"""Run Python sagas over Kafka events with exactly-once effects in PostgreSQL.

This package's top level is the authoring API: saga classes, handler decorators, the handles
injected into handlers, message declarations, and sagas as ordered steps or explicit state
machines. It imports no Kafka or PostgreSQL client, so saga and schema modules stay cheap to
import and test. The other public packages: :mod:`processor.participant` (services that answer
commands), :mod:`processor.publish` (services that feed sagas events), :mod:`processor.testing`
(the in-memory fixtures), :mod:`processor.ops` (operator services) and
:mod:`processor.settings`. Every module with a leading underscore in its path is internal;
docs/api.md lists the public names.
"""

import importlib
import warnings
from typing import Any

from processor import _compat
from processor._authoring.application import ParticipantApp, SagaApp
from processor._authoring.definition import (
    CancelRequest,
    DecisionRequest,
    SagaState,
    saga,
    saga_cancel_handler,
    saga_deadline_handler,
    saga_decision_handler,
    saga_event_handler,
)
from processor._authoring.functions import (
    SagaContext,
    StepFailed,
    Undo,
    saga_function,
)
from processor._authoring.handles import (
    SagaCommands,
    SagaDeadlines,
    SagaLifecycle,
    SagaOutcome,
    Setting,
)
from processor._authoring.messages import Message, MessageMetadata, MessageRegistry, message_type
from processor._authoring.messages import registry as message_registry
from processor._authoring.orchestration import (
    Escalation,
    MachineSaga,
    MachineState,
    OrchestratedSaga,
    Orchestration,
    Replies,
    RetryPolicy,
    SettingKeys,
    Step,
    Transitions,
    on_decision,
    on_reply,
    start_event,
)
from processor._authoring.upcasting import event_upcaster, upcaster
from processor._errors import (
    ConfigurationError,
    HandlerError,
    IllegalTransition,
    SagaDefinitionError,
    SagaError,
)

# Old module paths (processor.runtime.worker, processor.machine, ...) keep importing, with a
# DeprecationWarning, for one release.
_compat.install()

__all__ = [
    "CancelRequest",
    "ConfigurationError",
    "DecisionRequest",
    "Escalation",
    "HandlerError",
    "IllegalTransition",
    "MachineSaga",
    "MachineState",
    "Message",
    "MessageMetadata",
    "MessageRegistry",
    "OrchestratedSaga",
    "Orchestration",
    "ParticipantApp",
    "Replies",
    "RetryPolicy",
    "SagaApp",
    "SagaCommands",
    "SagaContext",
    "SagaDeadlines",
    "SagaDefinitionError",
    "SagaError",
    "SagaLifecycle",
    "SagaOutcome",
    "SagaState",
    "Setting",
    "SettingKeys",
    "Step",
    "StepFailed",
    "Transitions",
    "Undo",
    "event_upcaster",
    "message_registry",
    "message_type",
    "on_decision",
    "on_reply",
    "saga",
    "saga_cancel_handler",
    "saga_deadline_handler",
    "saga_decision_handler",
    "saga_event_handler",
    "saga_function",
    "start_event",
    "upcaster",
]

# Names this package offered before, and the module that offers them now. The publishers are
# loaded on first use either way: importing the package must not import the Kafka or Postgres
# clients.
_MOVED = {
    "EventPublisher": "processor.publish",
    "OutboxEventPublisher": "processor.publish",
    "OutboxRelay": "processor.publish",
    "PublishFailed": "processor.publish",
    "UnknownMessageType": "processor.publish",
    "definition_of": "processor._authoring.definition",
}


def __getattr__(name: str) -> Any:
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module 'processor' has no attribute {name!r}")
    internal = any(part.startswith("_") for part in home.split("."))
    where = f"it is internal now ({home})" if internal else f"import it from {home}"
    warnings.warn(f"processor.{name} is deprecated; {where}", DeprecationWarning, stacklevel=2)
    value = getattr(importlib.import_module(home), name)
    # Warned once: later uses find the name itself.
    globals()[name] = value
    return value
