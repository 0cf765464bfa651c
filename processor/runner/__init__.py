"""The pure core of the runtime: (state, input, now) -> outcome.

A :class:`BoundSaga` is a saga definition with every setting and dependency resolved at startup,
so a missing value stops the process before it consumes anything. Running a handler does no I/O:
it returns the new state and the recorded intents, and the engine persists them in one
transaction. The same code runs under the in-memory fixture in :mod:`processor.testing`.

The parts: :mod:`~processor.runner.bound` runs handlers, :mod:`~processor.runner.binder` binds
definitions at startup, :mod:`~processor.runner.operator` answers operators' requests,
:mod:`~processor.runner.inputs` and :mod:`~processor.runner.state` hold what a run takes and
gives, :mod:`~processor.runner.ids` names the commands it sends.
"""

from processor.runner.binder import bind, bind_all
from processor.runner.bound import BoundSaga
from processor.runner.ids import command_message_id
from processor.runner.inputs import DeadlineInput, EventInput, Outcome
from processor.runner.operator import OperatorRequest
from processor.runner.state import state_to_json, waiting_on, working_copy

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
