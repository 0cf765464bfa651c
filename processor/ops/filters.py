"""The saga list's search on saga state: ``path=value`` as JSON containment documents.

A search such as ``customer_id=c-7`` or ``address.country=DE`` becomes the document a saga's
state must contain (``state @> '{"customer_id": "c-7"}'``), the form a GIN index on the state
serves (migration 14). Values are compared as JSON: ``amount=42`` matches the number 42 and the
string ``"42"`` (states often keep decimals and ids as strings), ``ok=true`` the boolean and the
string; a value in double quotes (``order_id="42"``) is a string only.
"""

from __future__ import annotations

import json
from typing import Any

from processor.errors import SagaError

__all__ = ["StateSearchError", "state_documents"]

# A search is typed by a person; a longer one is a paste gone wrong.
MAX_LENGTH = 500


class StateSearchError(SagaError):
    """A state search that is not ``path=value``."""


def state_documents(text: str) -> list[dict[str, Any]]:
    """The documents one of which a matching saga's state contains.

    Args:
        text: ``path=value``; the path's keys are separated by dots (``address.country``).

    Raises:
        StateSearchError: The text is not ``path=value``, or a key of the path is empty.
    """
    if len(text) > MAX_LENGTH:
        raise StateSearchError(f"a state search is at most {MAX_LENGTH} characters")
    path, sep, raw = text.strip().partition("=")
    keys = [k.strip() for k in path.split(".")]
    if not sep or not all(keys):
        raise StateSearchError(
            f"search the state as path=value (customer_id=c-7, address.country=DE): {text!r}"
        )
    return [_nest(keys, value) for value in _values(raw.strip())]


def _values(raw: str) -> list[Any]:
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        try:
            return [str(json.loads(raw))]
        except json.JSONDecodeError:
            return [raw[1:-1]]
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        return [raw]
    # Only scalars: `items=[1]` would match any array holding 1, which reads as equality.
    if isinstance(parsed, bool | int | float) or parsed is None:
        return [parsed, raw]
    return [raw]


def _nest(keys: list[str], value: Any) -> dict[str, Any]:
    doc: Any = value
    for key in reversed(keys):
        doc = {key: doc}
    result: dict[str, Any] = doc
    return result
