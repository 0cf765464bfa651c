"""Checked string choices: how the authoring API refuses a value it does not know.

A policy or reply kind is a ``Literal`` so that mypy catches a typo, but sagas are also written
without mypy, and a wrong string used to be ignored or silently read as another choice. Every
such parameter is checked here when the saga is defined, and a wrong value names the
parameter, the value, the valid values and the closest one.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterable
from typing import Any

__all__ = ["choice_problem", "choices_of", "did_you_mean"]


def choices_of(allowed: Any) -> tuple[str, ...]:
    """The strings ``allowed`` permits: a ``Literal[...]`` alias, or an iterable of strings.

    Reading them off the ``Literal`` keeps the type the one list of valid values.
    """
    if typing.get_origin(allowed) is typing.Literal:
        return tuple(str(a) for a in typing.get_args(allowed))
    return tuple(allowed)


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the choice closest to ``value``, or ``""`` if none is."""
    options = list(choices)
    # Stray blanks and capitals are the commonest slips ("undo ", "Compensate").
    close = difflib.get_close_matches(value.strip().lower(), options, n=1)
    if not close:
        close = difflib.get_close_matches(value, options, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def choice_problem(parameter: str, value: object, allowed: Any) -> str | None:
    """The problem with ``parameter=value``, or None when ``value`` is one of ``allowed``.

    Args:
        parameter: The parameter's name as the author spells it (``"kind"``, ``"on_exhausted"``).
        value: The value given.
        allowed: A ``Literal[...]`` alias or an iterable of the valid strings.

    Returns:
        E.g. ``"kind='reject' is not one of 'succeeded', 'rejected'; did you mean
        'rejected'?"``, or None.
    """
    options = choices_of(allowed)
    if isinstance(value, str) and value in options:
        return None
    listed = ", ".join(repr(o) for o in options)
    hint = did_you_mean(value, options) if isinstance(value, str) else ""
    return f"{parameter}={value!r} is not one of {listed}{hint}"
