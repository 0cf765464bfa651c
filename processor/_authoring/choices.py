"""Checked string choices: how the authoring API refuses a value it does not know.

A policy or reply kind is a ``Literal`` so that mypy catches a typo, but sagas are also written
without mypy, and a wrong string used to be ignored or silently read as another choice. Every
such parameter is checked here when the saga is defined, and a wrong value names the
parameter, the value, the valid values and the closest one.

Keyword arguments declared once as a ``TypedDict`` (``**options: Unpack[PublishOptions]``) are
checked the same way: Python passes such a function any keyword, so a misspelt one would be
ignored where a declared parameter list refuses it.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["choice_problem", "choices_of", "did_you_mean", "known_keywords"]


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


def known_keywords(given: Mapping[str, object], declared: Any) -> None:
    """Refuses keywords that do not match the ``TypedDict`` ``declared``, as Python refuses them.

    Raises:
        TypeError: A keyword ``declared`` does not name (with the closest name it does), or one
            it requires is missing.
    """
    names = declared.__required_keys__ | declared.__optional_keys__
    unknown = sorted(set(given) - names)
    if unknown:
        raise TypeError(
            f"unexpected keyword argument {unknown[0]!r}{did_you_mean(unknown[0], names)} "
            f"(the keywords are {declared.__name__}'s: {', '.join(sorted(names))})"
        )
    missing = sorted(declared.__required_keys__ - set(given))
    if missing:
        raise TypeError(f"missing required keyword argument(s): {', '.join(missing)}")
