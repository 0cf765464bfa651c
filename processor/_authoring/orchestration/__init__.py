"""Sagas as explicit state machines, and a generic orchestrator of ordered steps.

Users import the authoring names from :mod:`processor`. Pure: like the rest of the authoring API,
nothing here imports a Kafka or PostgreSQL client.
"""

from processor._authoring.orchestration.analysis import MachineSpec, lint, mermaid
from processor._authoring.orchestration.declared import Replies, SettingKeys, start_event
from processor._authoring.orchestration.orchestrator import (
    SAGA_DEADLINE,
    STEP_TIMER,
    OrchestratedSaga,
    Progress,
    ReplyHandler,
    ReplyKind,
    on_decision,
    on_reply,
)
from processor._authoring.orchestration.progress import HandlerIo
from processor._authoring.orchestration.retry import NO_RETRY, RetryPolicy, jitter_fraction
from processor._authoring.orchestration.saga import MachineRecord, MachineSaga
from processor._authoring.orchestration.states import (
    ORCHESTRATED_TRANSITIONS,
    TERMINAL_STATES,
    MachineState,
    Transition,
    Transitions,
    machine_state_of,
)
from processor._authoring.orchestration.steps import (
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
