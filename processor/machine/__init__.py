"""Sagas as explicit state machines, and a generic orchestrator of ordered steps.

Pure: like the rest of the authoring API, nothing here imports a Kafka or PostgreSQL client.
"""

from processor.machine._declared import Replies, SettingKeys, start_event
from processor.machine.analysis import MachineSpec, lint, mermaid
from processor.machine.orchestrator import (
    SAGA_DEADLINE,
    STEP_TIMER,
    OrchestratedSaga,
    Progress,
    ReplyHandler,
    ReplyKind,
    on_decision,
    on_reply,
)
from processor.machine.progress import HandlerIo
from processor.machine.retry import NO_RETRY, RetryPolicy, jitter_fraction
from processor.machine.saga import MachineRecord, MachineSaga
from processor.machine.states import (
    ORCHESTRATED_TRANSITIONS,
    TERMINAL_STATES,
    MachineState,
    Transition,
    Transitions,
    machine_state_of,
)
from processor.machine.steps import (
    Attempt,
    Decision,
    Escalation,
    Orchestration,
    Step,
    StepTimer,
)

__all__ = [
    "NO_RETRY",
    "ORCHESTRATED_TRANSITIONS",
    "SAGA_DEADLINE",
    "STEP_TIMER",
    "TERMINAL_STATES",
    "Attempt",
    "Decision",
    "Escalation",
    "HandlerIo",
    "MachineRecord",
    "MachineSaga",
    "MachineSpec",
    "MachineState",
    "OrchestratedSaga",
    "Orchestration",
    "Progress",
    "Replies",
    "ReplyHandler",
    "ReplyKind",
    "RetryPolicy",
    "SettingKeys",
    "Step",
    "StepTimer",
    "Transition",
    "Transitions",
    "jitter_fraction",
    "lint",
    "machine_state_of",
    "mermaid",
    "on_decision",
    "on_reply",
    "start_event",
]
