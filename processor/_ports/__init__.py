"""The ports: every Protocol the core, loops and operator services speak to.

And the shapes that cross them:

- :mod:`processor._ports.consumer`: the consumer loop, Kafka, retention and the growth watch;
- :mod:`processor._ports.outbox` and :mod:`processor._ports.deadlines`: the relay and the poller;
- :mod:`processor._ports.operator`: the stores behind the operator commands and the console;
- :mod:`processor._ports.views` and :mod:`processor._ports.cluster`: the read models they return;
- :mod:`processor._ports.participant`: what the participant kit needs from a service's database;
- :mod:`processor._ports.factory`: what a running processor asks of its composition root.

Adapters (``processor._postgres``, ``processor._kafka``, ``processor._memory``) implement them;
nothing here imports an adapter or a client library.
"""

from processor._engine.rows import HeldMessage
from processor._ports.consumer import (
    TP,
    BatchStore,
    GrowthStore,
    Positions,
    Purge,
    RecordConsumer,
    RecordProducer,
    RetentionStore,
    TopicMetadata,
    WakeSource,
)
from processor._ports.deadlines import DeadlineRow, DeadlineStore
from processor._ports.factory import AdapterFactory, DatabaseGauges
from processor._ports.operator import (
    CheckSource,
    InspectStore,
    OperatorStore,
    ParkedSaga,
    ParkedStore,
    ResumeStore,
    StateCount,
    StoredSaga,
)
from processor._ports.outbox import (
    FAILED_VALUE_PREVIEW,
    FailedOutboxRow,
    FailedOutboxStore,
    FailedSelection,
    OutboxEntry,
    OutboxStore,
    SetAside,
)
from processor._ports.participant import InboxEntry, ParticipantStore, ParticipantTx, Rows, Sql

__all__ = [
    "FAILED_VALUE_PREVIEW",
    "TP",
    "AdapterFactory",
    "BatchStore",
    "CheckSource",
    "DatabaseGauges",
    "DeadlineRow",
    "DeadlineStore",
    "FailedOutboxRow",
    "FailedOutboxStore",
    "FailedSelection",
    "GrowthStore",
    "HeldMessage",
    "InboxEntry",
    "InspectStore",
    "OperatorStore",
    "OutboxEntry",
    "OutboxStore",
    "ParkedSaga",
    "ParkedStore",
    "ParticipantStore",
    "ParticipantTx",
    "Positions",
    "Purge",
    "RecordConsumer",
    "RecordProducer",
    "ResumeStore",
    "RetentionStore",
    "Rows",
    "SetAside",
    "Sql",
    "StateCount",
    "StoredSaga",
    "TopicMetadata",
    "WakeSource",
]
