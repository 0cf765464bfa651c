"""Hook points: a closed list, so a misspelt point fails loudly instead of never firing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from processor._runtime.hooks import HookPoint, Hooks

PROCESSOR = Path(__file__).resolve().parents[2] / "processor"


def test_a_point_may_be_named_by_member_or_by_value() -> None:
    hooks = Hooks()
    seen: list[str] = []
    hooks.on("after-commit", lambda: seen.append("by value"))
    hooks.on(HookPoint.AFTER_COMMIT, lambda: seen.append("by member"))
    hooks.fire(HookPoint.AFTER_COMMIT)
    hooks.fire("after-commit")
    assert seen == ["by value", "by member", "by value", "by member"]


def test_firing_a_point_with_nothing_registered_does_nothing() -> None:
    hooks = Hooks()
    for point in HookPoint:
        hooks.fire(point)


def test_an_unknown_point_is_refused_on_registration() -> None:
    hooks = Hooks()
    with pytest.raises(ValueError, match="unknown hook point 'after-comit'") as e:
        hooks.on("after-comit", lambda: None)
    # The message lists the known points, so the typo is easy to fix.
    assert all(p.value in str(e.value) for p in HookPoint)


def test_an_unknown_point_is_refused_when_fired() -> None:
    with pytest.raises(ValueError, match="unknown hook point 'worker-step'"):
        Hooks().fire("worker-step")


def _fired_points() -> set[str]:
    """The points named at ``<...>.fire(HookPoint.X)`` calls in processor/, as their values."""
    fired: set[str] = set()
    for path in PROCESSOR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "fire"
                and len(node.args) == 1
            ):
                continue
            arg = node.args[0]
            if (
                isinstance(arg, ast.Attribute)
                and isinstance(arg.value, ast.Name)
                and arg.value.id == "HookPoint"
            ):
                fired.add(HookPoint[arg.attr].value)
            elif isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                fired.add(arg.value)
    return fired


def test_every_point_is_fired_somewhere_and_only_points_are_fired() -> None:
    fired = _fired_points()
    # A member no loop fires would be a test hook that never runs; a fired name that is no
    # member would raise in production.
    assert {p.value for p in HookPoint} - fired == set()
    assert fired - {p.value for p in HookPoint} == set()
