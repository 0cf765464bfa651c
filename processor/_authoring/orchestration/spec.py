"""The machine an orchestrated saga actually uses, derived from its declared steps.

The diagram and ``lint-saga`` read it: only the states the steps can reach, the timers pending
in each, and the saga's own names for where it is (``substates``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from processor._authoring.orchestration.analysis import MachineSpec
from processor._authoring.orchestration.progress import SAGA_DEADLINE, STEP_TIMER
from processor._authoring.orchestration.replies import wiring_warnings
from processor._authoring.orchestration.saga import _saga_name
from processor._authoring.orchestration.states import MachineState, Transitions

if TYPE_CHECKING:
    from processor._authoring.orchestration.stepping import StepMachine

__all__ = ["orchestration_spec"]

_S = MachineState


def orchestration_spec(cls: type[StepMachine]) -> MachineSpec:
    """Describe the machine ``cls``'s orchestration actually uses."""
    o = cls.orchestration
    used = {_S.NEW, _S.COMPENSATING, _S.COMPLETED, _S.FAILED}
    if any(not s.waits_for_person for s in o.steps):
        used.add(_S.RUNNING)
    escalating = [s.name for s in o.steps if s.on_exhausted == "escalate"]
    # Compensation runs last step first; an undo out of retries waits on a person (WAITING).
    undoing = [s for s in reversed(o.steps) if s.compensation is not None]
    if undoing:
        used.add(_S.COMPENSATED)
    if o.has_waiting or escalating or undoing:
        used.add(_S.WAITING)
    if o.sla is not None:
        used.add(_S.TIMED_OUT)
    edges = {src: [t for t in cls.machine_transitions.targets(src) if t in used] for src in used}
    saga_timer = {SAGA_DEADLINE} if o.sla is not None else set()
    timers = {
        _S.RUNNING: frozenset({STEP_TIMER, *saga_timer}),
        _S.WAITING: frozenset({STEP_TIMER, *saga_timer}),
        _S.COMPENSATING: frozenset({STEP_TIMER}),
    }
    ending = {_S.COMPLETED, _S.COMPENSATED, _S.FAILED}
    if o.on_saga_timeout == "escalate":
        ending.add(_S.TIMED_OUT)

    def listing(label: str, names: list[str]) -> str:
        return f"{label} {', '.join(names)}" if names else ""

    waits = [s.name for s in o.steps if s.waits_for_person]
    notes = {
        _S.RUNNING: listing("steps", [s.name for s in o.steps if not s.waits_for_person]),
        _S.WAITING: "; ".join(
            part
            for part in (
                listing("waits for", waits),
                listing("escalates", escalating),
                listing("undo escalates", [s.name for s in undoing]),
            )
            if part
        ),
        _S.COMPENSATING: (
            "undo " + ", then ".join(s.name for s in undoing) + " (last step first)"
            if undoing
            else ""
        ),
    }
    return MachineSpec(
        name=_saga_name(cls),
        transitions=Transitions.of(edges, initial=cls.machine_transitions.initial),
        timers={s: t for s, t in timers.items() if s in used},
        ending=frozenset(ending),
        notes={s: n for s, n in notes.items() if s in used and n},
        wiring=tuple(wiring_warnings(cls)),
        substates={
            state: names
            for state, names in (
                (_S.RUNNING, tuple(s.state_name for s in o.steps if not s.waits_for_person)),
                (
                    _S.WAITING,
                    tuple(s.state_name for s in o.steps if s.waits_for_person)
                    + tuple(
                        f"{s.state_name}_ESCALATED" for s in o.steps if s.on_exhausted == "escalate"
                    )
                    + tuple(f"{s.state_name}_UNDO_ESCALATED" for s in undoing),
                ),
                (_S.COMPENSATING, tuple(f"{s.state_name}_UNDO" for s in undoing)),
            )
            if names and state in used
        },
        ordered=frozenset({_S.COMPENSATING}),
    )
