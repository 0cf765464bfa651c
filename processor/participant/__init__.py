"""The other half of every saga: services that consume commands and answer with events.

Declare handlers with :func:`participant` and :func:`command_handler`, ask for parameters by
type (the command, :class:`~processor.messages.MessageMetadata`, :class:`Replies`, :class:`Sql`,
settings, dependencies), and run them with
:class:`processor.bootstrap.participant.ParticipantService` (or :class:`CommandKit` over any
:class:`ParticipantStore`). Each command runs once in effect: inbox row, handler SQL,
replies and position commit together.
"""

from processor.participant.definition import (
    DROP,
    CommandHandlerDef,
    Expired,
    ParticipantDefinition,
    command_handler,
    participant,
    participant_of,
)
from processor.participant.handles import Replies, SkipDelivery
from processor.participant.kit import CommandKit, Counters
from processor.ports.participant import InboxEntry, ParticipantStore, ParticipantTx, Rows, Sql

__all__ = [
    "DROP",
    "CommandHandlerDef",
    "CommandKit",
    "Counters",
    "Expired",
    "InboxEntry",
    "ParticipantDefinition",
    "ParticipantStore",
    "ParticipantTx",
    "Replies",
    "Rows",
    "SkipDelivery",
    "Sql",
    "command_handler",
    "participant",
    "participant_of",
]
