"""Machine states, the transitions a saga declares, and the record of transitions taken.

A saga's current machine state is a plain string column operators can query, so the states are a
``StrEnum`` whose values are what lands in the database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict

from processor._errors import IllegalTransition, SagaDefinitionError

__all__ = [
    "ORCHESTRATED_TRANSITIONS",
    "TERMINAL_STATES",
    "MachineState",
    "Transition",
    "Transitions",
    "machine_state_of",
]


class MachineState(StrEnum):
    """The canonical states of a saga seen as a state machine."""

    NEW = "NEW"
    RUNNING = "RUNNING"
    WAITING = "WAITING"
    COMPENSATING = "COMPENSATING"
    COMPLETED = "COMPLETED"
    COMPENSATED = "COMPENSATED"
    FAILED = "FAILED"
    COMPENSATION_FAILED = "COMPENSATION_FAILED"
    TIMED_OUT = "TIMED_OUT"


TERMINAL_STATES = frozenset(
    {
        MachineState.COMPLETED,
        MachineState.COMPENSATED,
        MachineState.FAILED,
        MachineState.COMPENSATION_FAILED,
    }
)
"""States nothing leaves. TIMED_OUT is not among them: a policy usually moves on from it."""


class Transition(BaseModel):
    """One transition taken, kept in the saga state as its audit trail.

    Attributes:
        source: State left.
        target: State entered.
        at: Handler clock reading when it happened.
        reason: Why, in a few words (e.g. ``"step pay timed out"``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: MachineState
    target: MachineState
    at: datetime
    reason: str


@dataclass(frozen=True)
class Transitions:
    """The transitions a saga allows, declared once on the saga class.

    Staying in the same state is always allowed and is not a transition.

    Attributes:
        initial: The state of a new instance.
        allowed: Target states per source state.
    """

    initial: MachineState
    allowed: Mapping[MachineState, frozenset[MachineState]]

    @classmethod
    def of(
        cls,
        edges: Mapping[MachineState, Iterable[MachineState]],
        *,
        initial: MachineState = MachineState.NEW,
    ) -> Transitions:
        """Build a table from ``{source: targets}``; states without an entry are terminal.

        Raises:
            SagaDefinitionError: An edge leaves a terminal state.
        """
        allowed = {src: frozenset(dst) - {src} for src, dst in edges.items()}
        problems = [
            f"{src} is terminal and cannot lead to {sorted(dst)}"
            for src, dst in allowed.items()
            if src in TERMINAL_STATES and dst
        ]
        if problems:
            raise SagaDefinitionError(problems, subject="state machine")
        return cls(initial, MappingProxyType(allowed))

    @property
    def states(self) -> frozenset[MachineState]:
        """Every state named as a source or a target, plus the initial state."""
        found = {self.initial, *self.allowed}
        for targets in self.allowed.values():
            found.update(targets)
        return frozenset(found)

    def targets(self, source: MachineState) -> frozenset[MachineState]:
        """States reachable from ``source`` in one transition."""
        return self.allowed.get(source, frozenset())

    def check(self, source: MachineState, target: MachineState) -> None:
        """Raise unless moving from ``source`` to ``target`` is declared (or a self-loop).

        Raises:
            IllegalTransition: The transition is not declared.
        """
        if source != target and target not in self.targets(source):
            allowed = ", ".join(sorted(self.targets(source))) or "nothing (terminal)"
            raise IllegalTransition(
                f"illegal transition {source} -> {target}; {source} may go to {allowed}"
            )


_S = MachineState
ORCHESTRATED_TRANSITIONS = Transitions.of(
    {
        # FAILED straight from NEW: the first step's budget is already too small and there is
        # nothing to undo.
        _S.NEW: {_S.RUNNING, _S.WAITING, _S.FAILED},
        _S.RUNNING: {_S.WAITING, _S.COMPENSATING, _S.COMPLETED, _S.FAILED, _S.TIMED_OUT},
        _S.WAITING: {_S.RUNNING, _S.COMPENSATING, _S.COMPLETED, _S.FAILED, _S.TIMED_OUT},
        # COMPENSATED once every undo ran; FAILED when compensation found nothing to undo (only
        # steps in doubt that never landed); WAITING on a person when an undo ran out of retries.
        # COMPENSATION_FAILED is not among them: the orchestrator always asks a person.
        _S.COMPENSATING: {_S.COMPENSATED, _S.FAILED, _S.WAITING},
        _S.TIMED_OUT: {_S.COMPENSATING, _S.FAILED},
    }
)
"""What the orchestrator may do; it never takes a transition outside this table."""


def machine_state_of(state: object) -> str | None:
    """Return the machine state stored in the ``machine_state`` column, or None.

    Sagas that are not state machines have no machine state.
    """
    # Asked for every saga row a batch writes: a missing attribute on a pydantic model costs a
    # formatted AttributeError each time, so the answer is kept per class.
    cls = type(state)
    has = _HAS_MACHINE_STATE.get(cls)
    if has is None:
        has = _HAS_MACHINE_STATE[cls] = hasattr(cls, "machine_state")
    if not has:
        return None
    value = getattr(state, "machine_state", None)
    return str(value) if isinstance(value, MachineState) else None


_HAS_MACHINE_STATE: dict[type, bool] = {}
