"""The participant kit: command handlers declared, bound and run once each in effect.

Users import these names from :mod:`processor.participant`, which adds the service that runs
them over PostgreSQL and Kafka. The kit itself (:class:`CommandKit`) runs over any
:class:`ParticipantStore`: inbox row, handler SQL, replies and position commit together.
"""

from processor._authoring.participant.definition import (
    DROP,
    CommandHandlerDef,
    Expired,
    ParticipantDefinition,
    command_handler,
    participant,
    participant_of,
)
from processor._authoring.participant.handles import Bucket, Replies, SkipDelivery
from processor._authoring.participant.kit import CommandKit, Counters
from processor._ports.participant import (
    Claim,
    InboxEntry,
    ParticipantStore,
    ParticipantTx,
    Rows,
    Sql,
)

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
