"""Sagas written as one ``async def``, made durable by a journal replayed in the saga's row."""

from processor._authoring.functions.context import (
    Cancelled,
    DeadlinePassed,
    Nondeterminism,
    Rejected,
    SagaContext,
    StepFailed,
    TimedOut,
    Undo,
)
from processor._authoring.functions.declare import (
    CACHE_SIZE,
    JOURNAL_LIMIT,
    function_spec,
    saga_function,
)
from processor._authoring.functions.journal import Entry, FunctionState, Pending, Wire

__all__ = [
    "CACHE_SIZE",
    "JOURNAL_LIMIT",
    "Cancelled",
    "DeadlinePassed",
    "Entry",
    "FunctionState",
    "Nondeterminism",
    "Pending",
    "Rejected",
    "SagaContext",
    "StepFailed",
    "TimedOut",
    "Undo",
    "Wire",
    "function_spec",
    "saga_function",
]
