"""The pure core of the runtime: (state, input, now) -> outcome.

A :class:`BoundSaga` is a saga definition with every setting and dependency resolved at startup,
so a missing value stops the process before it consumes anything. Running a handler does no I/O:
it returns the new state and the recorded intents, and the engine persists them in one
transaction. The same code runs under the in-memory fixture in :mod:`processor.testing`.

The parts: :mod:`~processor._invocation.bound` runs handlers, :mod:`~processor._invocation.binder`
binds definitions at startup, :mod:`~processor._invocation.operator` answers operators' requests,
:mod:`~processor._invocation.inputs` and :mod:`~processor._invocation.state` hold what a run takes
and gives, :mod:`~processor._invocation.ids` names the commands it sends.
"""

from processor._invocation.binder import bind, bind_all
from processor._invocation.bound import BoundSaga
from processor._invocation.ids import command_message_id
from processor._invocation.inputs import DeadlineInput, EventInput, Outcome
from processor._invocation.operator import OperatorRequest
from processor._invocation.state import state_to_json, waiting_on, working_copy

__all__ = [
    "BoundSaga",
    "DeadlineInput",
    "EventInput",
    "OperatorRequest",
    "Outcome",
    "bind",
    "bind_all",
    "command_message_id",
    "state_to_json",
    "waiting_on",
    "working_copy",
]
