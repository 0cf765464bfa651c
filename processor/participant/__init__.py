"""The other half of every saga: services that consume commands and answer with events.

Declare handlers with :func:`participant` and :func:`command_handler`, ask for parameters by
type (the command, :class:`processor.MessageMetadata`, :class:`Replies`, :class:`Sql`,
:class:`Bucket`, settings, dependencies), and run them with :class:`ParticipantService` (or
:class:`CommandKit` over any :class:`ParticipantStore`). Each command runs once in effect: inbox
row, handler SQL, replies and position commit together; a handler raises :class:`Retryable` to
have its command tried again later instead of dead-lettered.

:class:`ParticipantService` and :func:`migrate` need the Kafka and PostgreSQL clients: they are
imported on first use of their names, so a module declaring handlers stays cheap to import.
"""

import importlib
from typing import TYPE_CHECKING, Any

from processor._authoring.participant import (
    DROP,
    Bucket,
    Claim,
    CommandHandlerDef,
    CommandKit,
    Counters,
    Expired,
    InboxEntry,
    ParticipantDefinition,
    ParticipantStore,
    ParticipantTx,
    Replies,
    Rows,
    SkipDelivery,
    Sql,
    command_handler,
    participant,
    participant_of,
)
from processor._errors import Retryable

if TYPE_CHECKING:
    from processor._bootstrap.participant import ParticipantService, migrate

__all__ = [
    "DROP",
    "Bucket",
    "Claim",
    "CommandHandlerDef",
    "CommandKit",
    "Counters",
    "Expired",
    "InboxEntry",
    "ParticipantDefinition",
    "ParticipantService",
    "ParticipantStore",
    "ParticipantTx",
    "Replies",
    "Retryable",
    "Rows",
    "SkipDelivery",
    "Sql",
    "command_handler",
    "migrate",
    "participant",
    "participant_of",
]

_SERVICE = frozenset({"ParticipantService", "migrate"})


def __getattr__(name: str) -> Any:
    if name in _SERVICE:
        return getattr(importlib.import_module("processor._bootstrap.participant"), name)
    raise AttributeError(f"module 'processor.participant' has no attribute {name!r}")
