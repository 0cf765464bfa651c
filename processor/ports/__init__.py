"""The ports: every Protocol the core, loops and operator services speak to.

And the shapes that cross them:

- :mod:`processor.ports.engine`: the consumer loop, Kafka, retention and the growth watch;
- :mod:`processor.ports.outbox` and :mod:`processor.ports.deadlines`: the relay and the poller;
- :mod:`processor.ports.operator`: the stores behind the operator commands and the console;
- :mod:`processor.ports.views` and :mod:`processor.ports.cluster`: the read models they return;
- :mod:`processor.ports.participant`: what the participant kit needs from a service's database;
- :mod:`processor.ports.factory`: what a running processor asks of its composition root.

Adapters (``processor.postgres``, ``processor.kafka``, ``processor.memory``) implement them;
nothing here imports an adapter or a client library.
"""

from processor.engine.rows import HeldMessage
from processor.ports.deadlines import DeadlineRow, DeadlineStore
from processor.ports.engine import (
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
from processor.ports.factory import AdapterFactory, DatabaseGauges
from processor.ports.operator import (
    CheckSource,
    InspectStore,
    OperatorStore,
    ParkedSaga,
    ParkedStore,
    ResumeStore,
    StateCount,
    StoredSaga,
)
from processor.ports.outbox import (
    FAILED_VALUE_PREVIEW,
    FailedOutboxRow,
    FailedOutboxStore,
    FailedSelection,
    OutboxEntry,
    OutboxStore,
    SetAside,
)
from processor.ports.participant import InboxEntry, ParticipantStore, ParticipantTx, Rows, Sql

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
