"""The base class of sagas written as explicit state machines.

The current machine state lives in the saga state, so it is saved in the same transaction as
everything else the handler decided; the engine also copies it into the ``machine_state``
column for operators. A transition the class does not declare raises
:class:`~processor._errors.IllegalTransition` inside the handler, so the engine never commits it
and parks the saga with the error instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from processor._authoring.definition import SagaState, definition_of
from processor._authoring.orchestration.analysis import MachineSpec
from processor._authoring.orchestration.states import (
    ORCHESTRATED_TRANSITIONS,
    TERMINAL_STATES,
    MachineState,
    Transition,
    Transitions,
)
from processor._errors import SagaDefinitionError

__all__ = ["MachineRecord", "MachineSaga"]


class MachineRecord(BaseModel):
    """The durable machine part of a saga's state.

    Attributes:
        state: Current state.
        transitions: Every transition taken, oldest first.
    """

    model_config = ConfigDict(validate_assignment=True, extra="forbid")

    state: MachineState = MachineState.NEW
    transitions: list[Transition] = Field(default_factory=list)


class MachineSaga(SagaState):
    """A saga whose progress is an explicit state from :class:`MachineState`.

    Subclasses declare ``machine_transitions`` (defaults to the orchestrator's table), and for
    the lint, ``machine_timers`` (deadline names pending per state) and ``machine_ending``
    (states in which the saga ends).
    """

    machine_transitions: ClassVar[Transitions] = ORCHESTRATED_TRANSITIONS
    machine_timers: ClassVar[Mapping[MachineState, frozenset[str]]] = {}
    machine_ending: ClassVar[frozenset[MachineState]] = TERMINAL_STATES

    machine: MachineRecord = Field(default_factory=MachineRecord)

    @property
    def machine_state(self) -> MachineState:
        """The current machine state (stored in the ``machine_state`` column)."""
        return self.machine.state

    def transition_to(self, target: MachineState, now: datetime, reason: str) -> None:
        """Move to ``target``, recording when and why; staying put records nothing.

        Raises:
            IllegalTransition: The class does not declare the transition.
        """
        source = self.machine.state
        type(self).machine_transitions.check(source, target)
        if source == target:
            return
        self.machine.transitions.append(
            Transition(source=source, target=target, at=now, reason=reason)
        )
        self.machine.state = target

    @classmethod
    def machine_spec(cls) -> MachineSpec:
        """Describe this saga's machine for the diagram and the lint."""
        return MachineSpec(
            name=_saga_name(cls),
            transitions=cls.machine_transitions,
            timers=dict(cls.machine_timers),
            ending=cls.machine_ending,
        )


def _saga_name(cls: type[SagaState]) -> str:
    try:
        return definition_of(cls).saga_type
    except SagaDefinitionError:
        return cls.__qualname__
