"""Static views of a state machine: a Mermaid diagram and a lint of its declaration.

Pure functions over a :class:`MachineSpec`, so the CLI, the tests and a CI check all read the
same answer.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from processor._authoring.orchestration.states import MachineState, Transitions

__all__ = ["MachineSpec", "lint", "mermaid"]


@dataclass(frozen=True)
class MachineSpec:
    """What a saga declares about its machine, as the analysis needs it.

    Attributes:
        name: Saga type name, for messages.
        transitions: Allowed transitions.
        timers: Deadline names that may be pending while in each state.
        ending: States in which the saga ends (its remaining deadlines are then cancelled).
        notes: Extra text per state for the diagram (e.g. the steps run in it).
        wiring: Problems the saga class found in its own handlers, reported by the lint.
        substates: The saga's own states inside a canonical one (its steps), in order.
        ordered: States whose substates always run one after another in the listed order
            (an orchestrated saga's COMPENSATING: its undos, last step first); the diagrams
            chain them with arrows.
    """

    name: str
    transitions: Transitions
    timers: Mapping[MachineState, frozenset[str]] = field(default_factory=dict)
    ending: frozenset[MachineState] = frozenset()
    notes: Mapping[MachineState, str] = field(default_factory=dict)
    wiring: tuple[str, ...] = ()
    substates: Mapping[MachineState, tuple[str, ...]] = field(default_factory=dict)
    ordered: frozenset[MachineState] = frozenset()

    def reachable(self) -> frozenset[MachineState]:
        """States reachable from the initial state."""
        seen = {self.transitions.initial}
        todo = [self.transitions.initial]
        while todo:
            for target in self.transitions.targets(todo.pop()):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return frozenset(seen)

    def terminal(self) -> frozenset[MachineState]:
        """States with no outgoing transition, and states the saga ends in."""
        return frozenset(s for s in self.transitions.states if not self.transitions.targets(s)) | (
            self.ending & self.transitions.states
        )


def _order(states: frozenset[MachineState]) -> list[MachineState]:
    rank = {s: i for i, s in enumerate(MachineState)}
    return sorted(states, key=lambda s: rank[s])


def lint(spec: MachineSpec) -> list[str]:
    """Return one line per problem; an empty list means the machine looks sound.

    Checks: states no transition reaches; WAITING states with no timer (a saga parked with
    nothing to wake it waits forever); terminal states that do not end the saga while timers
    exist (its pending deadlines would fire into a finished saga, or linger forever); and what
    the saga class reports about its wiring (steps no reply handler moves on).
    """
    problems: list[str] = [f"{spec.name}: {line}" for line in spec.wiring]
    states = spec.transitions.states
    for s in _order(states - spec.reachable()):
        problems.append(f"{spec.name}: state {s} is unreachable from {spec.transitions.initial}")
    for s in _order(states):
        if s == MachineState.WAITING and not spec.timers.get(s):
            problems.append(
                f"{spec.name}: state {s} has no timer; schedule a deadline so a saga parked "
                "there is woken (and escalated) even if nobody answers"
            )
    armed = frozenset().union(*spec.timers.values()) if spec.timers else frozenset()
    for s in _order(spec.terminal() - spec.ending):
        if armed:
            names = ", ".join(sorted(armed))
            problems.append(
                f"{spec.name}: terminal state {s} does not end the saga, so deadlines ({names}) "
                "may be left behind; end the saga there or cancel them"
            )
    return problems


def mermaid(spec: MachineSpec) -> str:
    """Render the machine as a Mermaid ``stateDiagram-v2``."""
    lines = ["stateDiagram-v2", f"    %% saga {spec.name}"]
    lines.append(f"    [*] --> {spec.transitions.initial}")
    for source in _order(spec.transitions.states):
        for target in _order(spec.transitions.targets(source)):
            lines.append(f"    {source} --> {target}")
    for s in _order(spec.terminal()):
        lines.append(f"    {s} --> [*]")
    for s in _order(spec.transitions.states):
        inner = spec.substates.get(s, ())
        if inner and s in spec.ordered:
            # Run one after another (compensation: last step first): drawn as a chain.
            lines.append(f"    state {s} {{")
            lines.append(f"        [*] --> {inner[0]}")
            lines.extend(f"        {a} --> {b}" for a, b in itertools.pairwise(inner))
            lines.append(f"        {inner[-1]} --> [*]")
            lines.append("    }")
        elif inner:
            # The saga's own states for its steps, drawn inside the canonical one.
            lines.append(f"    state {s} {{")
            lines.extend(f"        {name}" for name in inner)
            lines.append("    }")
    for s in _order(spec.transitions.states):
        parts = []
        if spec.notes.get(s):
            parts.append(spec.notes[s])
        if spec.timers.get(s):
            parts.append("timers: " + ", ".join(sorted(spec.timers[s])))
        if parts:
            lines.append(f"    note right of {s}: {'; '.join(parts)}")
    return "\n".join(lines) + "\n"
