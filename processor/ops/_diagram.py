"""Finds a state machine saga, for `diagram TARGET`; draws it as SVG.

TARGET is `MODULE:CLASS`, or the application object `MODULE:ATTR` (then `--saga` picks one of its
state machine sagas, unless it has only one). It needs neither the database nor Kafka: it reads
the saga class only. A saga function has no machine, and is refused naming what to use instead;
`lint-saga` finds its sagas in :mod:`processor.ops._lint`.
"""

from __future__ import annotations

from html import escape
from typing import Any

from processor._authoring.application import SagaApp, import_target
from processor._authoring.definition import definition_of
from processor._authoring.functions.declare import function_spec
from processor._authoring.orchestration import MachineSaga, MachineSpec, MachineState
from processor._errors import SagaDefinitionError, SagaError

__all__ = ["load_spec", "svg"]


def load_spec(target: str, saga: str | None = None) -> MachineSpec:
    """Import ``module:Class`` (or an app's saga) and describe its state machine.

    Args:
        target: `MODULE:CLASS`, or `MODULE:ATTR` naming a `SagaApp`.
        saga: With an app: the saga type or class name to describe.

    Raises:
        SagaError: The target is malformed, missing, or not a state machine saga.
    """
    found = import_target(
        target,
        "name the saga as MODULE:CLASS (or an app as MODULE:ATTR), e.g. "
        f"sagas.order:OrderSaga; got {target!r}",
    )
    if isinstance(found, SagaApp):
        found = _pick(target, found, saga)
    if isinstance(found, type) and function_spec(found) is not None:
        raise SagaError(_no_machine(target))
    if not (isinstance(found, type) and issubclass(found, MachineSaga)):
        raise SagaError(f"{target} is not a state machine saga (subclass processor.MachineSaga)")
    return found.machine_spec()


def _pick(target: str, app: SagaApp, saga: str | None) -> type[MachineSaga]:
    machines = [c for c in app.sagas if isinstance(c, type) and issubclass(c, MachineSaga)]
    names = {name: c for c in machines for name in (c.__name__, _saga_type(c))}
    if saga is not None:
        functions = {n for c in app.sagas if function_spec(c) for n in (c.__name__, _saga_type(c))}
        if saga in functions:
            raise SagaError(_no_machine(f"{target} --saga {saga}"))
        if saga not in names:
            raise SagaError(
                f"{target} runs no state machine saga named {saga!r}; it has {sorted(names)}"
            )
        return names[saga]
    if len(machines) != 1:
        raise SagaError(
            f"{target} runs {len(machines)} state machine sagas; pick one with --saga "
            f"(one of {sorted(c.__name__ for c in machines)})"
        )
    return machines[0]


def _no_machine(target: str) -> str:
    # A saga function's course is its code: there is no declared machine to draw.
    return (
        f"{target} is a saga function (@saga_function), which has no state machine to draw; "
        "its awaits are the function's code, `lint-saga` checks them, and `show` lists a "
        "running saga's journal"
    )


def _saga_type(cls: type[Any]) -> str:
    try:
        return definition_of(cls).saga_type
    except SagaDefinitionError:
        return cls.__name__


def svg(spec: MachineSpec, current: str | None = None, substate: str | None = None) -> str:
    """The machine as an SVG drawing, ``current`` highlighted (for the web console).

    States are laid out in columns by their distance from the initial state, so the drawing
    reads left to right the way a saga runs; each state is a ``<g class="state">`` with a
    ``data-state`` attribute, and the current one has the class ``current`` as well.

    Below them, one lane per state that has the saga's own states inside it (its steps), each
    a ``<g class="substate">`` with ``data-substate`` and ``data-in`` (the canonical state), in
    the spec's order; ``substate`` (the saga's ``progress.state``) is highlighted when it is
    inside ``current``. The lanes of ordered states (an orchestrated saga's COMPENSATING) are
    chained with arrows in the order they run: the undos, last step first.
    """
    states = spec.transitions.states
    depth = {spec.transitions.initial: 0}
    todo = [spec.transitions.initial]
    while todo:
        s = todo.pop(0)
        for t in sorted(spec.transitions.targets(s)):
            if t not in depth:
                depth[t] = depth[s] + 1
                todo.append(t)
    for s in sorted(states):
        depth.setdefault(s, max(depth.values(), default=0) + 1)
    columns: dict[int, list[str]] = {}
    for s in sorted(depth, key=lambda x: (depth[x], str(x))):
        columns.setdefault(depth[s], []).append(str(s))
    w, h, gap_x, gap_y = 170, 40, 60, 30
    pos: dict[str, tuple[int, int]] = {}
    for col, names in columns.items():
        for row, name in enumerate(names):
            pos[name] = (20 + col * (w + gap_x), 20 + row * (h + gap_y))
    width = 40 + len(columns) * (w + gap_x)
    height = 40 + max(len(n) for n in columns.values()) * (h + gap_y)
    lanes = [
        (str(s), spec.substates[s], s in spec.ordered)
        for s in _ordered(spec.substates)
        if spec.substates[s] and s in states
    ]
    sub_w, sub_h, sub_gap, label_w = 190, 28, 30, 140
    lanes_top = height
    if lanes:
        longest = max(len(inner) for _, inner, _ in lanes)
        width = max(width, 20 + label_w + longest * (sub_w + sub_gap) + 20)
        height += len(lanes) * (sub_h + 22) + 10
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="machine" width="100%" '
        f'style="max-width: {width}px" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="state machine of {escape(spec.name)}">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
        'fill="#667"/></marker></defs>',
    ]
    for source in sorted(states):
        for target in sorted(spec.transitions.targets(source)):
            (x1, y1), (x2, y2) = pos[str(source)], pos[str(target)]
            sx, sy = x1 + w, y1 + h // 2
            tx, ty = x2, y2 + h // 2
            if x2 <= x1:  # backwards or within a column: leave from the bottom, arrive below
                sx, sy, tx, ty = x1 + w // 2, y1 + h, x2 + w // 2, y2 + h
            out.append(
                f'<line x1="{sx}" y1="{sy}" x2="{tx}" y2="{ty}" stroke="#99a" '
                'stroke-width="1.5" marker-end="url(#arrow)"/>'
            )
    for name, (x, y) in pos.items():
        is_current = name == current
        classes = "state current" if is_current else "state"
        fill, stroke, color = (
            ("#ffd54f", "#e65100", "#000") if is_current else ("#eef", "#556", "#223")
        )
        ending = " ending" if name in {str(s) for s in spec.ending} else ""
        weight = ' font-weight="bold"' if is_current else ""
        out.append(
            f'<g class="{classes}{ending}" data-state="{escape(name)}">'
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="{3 if is_current else 1}"/>'
            f'<text x="{x + w // 2}" y="{y + h // 2 + 5}" text-anchor="middle" '
            f'font-family="sans-serif" font-size="13" fill="{color}"{weight}>'
            f"{escape(name)}</text></g>"
        )
    for lane, (state, inner, ordered) in enumerate(lanes):
        y = lanes_top + lane * (sub_h + 22)
        out.append(
            f'<text x="20" y="{y + sub_h // 2 + 4}" font-family="sans-serif" font-size="12" '
            f'fill="#556">{escape(state)}{" (in order)" if ordered else ""}</text>'
        )
        for i, name in enumerate(inner):
            x = 20 + label_w + i * (sub_w + sub_gap)
            if ordered and i:
                out.append(
                    f'<line x1="{x - sub_gap}" y1="{y + sub_h // 2}" x2="{x}" '
                    f'y2="{y + sub_h // 2}" stroke="#99a" stroke-width="1.5" '
                    'marker-end="url(#arrow)"/>'
                )
            here = name == substate and state == current
            fill, stroke = ("#ffd54f", "#e65100") if here else ("#f6f6fb", "#889")
            out.append(
                f'<g class="substate{" current-substate" if here else ""}" '
                f'data-substate="{escape(name)}" data-in="{escape(state)}">'
                f'<rect x="{x}" y="{y}" width="{sub_w}" height="{sub_h}" rx="6" fill="{fill}" '
                f'stroke="{stroke}" stroke-width="{2 if here else 1}"/>'
                f'<text x="{x + sub_w // 2}" y="{y + sub_h // 2 + 4}" text-anchor="middle" '
                f'font-family="sans-serif" font-size="11" fill="#223">{escape(name)}</text></g>'
            )
    out.append("</svg>")
    return "\n".join(out)


def _ordered(states: Any) -> list[Any]:
    """``states`` in the order the machine's states are declared (NEW, RUNNING, ...)."""
    rank = {s: i for i, s in enumerate(MachineState)}
    return sorted(states, key=lambda s: rank.get(s, len(rank)))
