"""The saga list's search on saga state: ``path=value`` as JSON containment documents.

A search such as ``customer_id=c-7`` or ``address.country=DE`` becomes the document a saga's
state must contain (``state @> '{"customer_id": "c-7"}'``), the form a GIN index on the state
serves (migration 14). Values are compared as JSON: ``amount=42`` matches the number 42 and the
string ``"42"`` (states often keep decimals and ids as strings), ``ok=true`` the boolean and the
string; a value in double quotes (``order_id="42"``) is a string only.

:func:`list_filters` reads the sagas list's filters (the console's query string, the options
of ``sagas list``) into what ``InspectQueries.list_sagas`` takes; :func:`cursor` is a page's
cursor (its last row), the ``after`` of the next.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from processor._authoring.handles import SagaOutcome
from processor._errors import SagaError
from processor._ports.views import SagaSummary
from processor.settings import parse_duration

__all__ = [
    "OUTCOMES",
    "STATUSES",
    "StateSearchError",
    "age_text",
    "cursor",
    "duration",
    "list_filters",
    "state_documents",
]

OUTCOMES = tuple(o.value for o in SagaOutcome)
STATUSES = ("active", "parked", "ended")

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


def list_filters(
    params: Mapping[str, str], names: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The sagas list's filters from its parameters, as `InspectQueries.list_sagas` takes them.

    Args:
        params: ``type``, ``status``, ``state``, ``older_than``, ``outcome``, ``correlation``,
            ``attr`` (a state search) and ``after`` (a :func:`cursor`); empty ones are unset.
        names: What to call a parameter in a refusal (``{"older_than": "--older-than"}``);
            ``parameter older_than`` otherwise.

    Raises:
        SagaError: A filter is malformed (a state search, an outcome, a duration or a cursor),
            in one line naming it: ``bad parameter older_than: ...``.
    """

    def label(name: str) -> str:
        return (names or {}).get(name) or f"parameter {name}"

    after = None
    try:
        if params.get("after"):
            at, saga_type, saga_id = params["after"].split("|", 2)
            after = (datetime.fromisoformat(at), saga_type, saga_id)
    except ValueError as e:
        raise SagaError(f"bad {label('after')}: {str(e)[:200]}") from e
    older = (
        _duration(label("older_than"), params["older_than"]) if params.get("older_than") else None
    )
    status = params.get("status") or None
    if status is not None and status not in STATUSES:
        raise SagaError(f"bad {label('status')}: one of {', '.join(STATUSES)}")
    outcome = params.get("outcome") or None
    if outcome is not None and outcome not in OUTCOMES:
        raise SagaError(f"bad {label('outcome')}: one of {', '.join(OUTCOMES)}")
    search = (params.get("attr") or "").strip()
    try:
        documents = state_documents(search) if search else []
    except StateSearchError as e:
        raise StateSearchError(f"bad {label('attr')}: {e}") from e
    return {
        "saga_type": params.get("type") or None,
        "status": status,
        "machine_state": params.get("state") or None,
        "older_than": older,
        "after": after,
        "outcome": outcome,
        "correlation_id": (params.get("correlation") or "").strip() or None,
        "state_contains": documents,
    }


def cursor(last: SagaSummary) -> str:
    """The ``after`` of the page that follows the one ending with ``last``."""
    return f"{last.updated_at.isoformat()}|{last.saga_type}|{last.saga_id}"


def duration(name: str, value: str) -> timedelta:
    """The duration ``value`` of the parameter ``name``.

    Raises:
        SagaError: It is no duration the console can subtract from now.
    """
    return _duration(f"parameter {name}", value)


def age_text(seconds: float) -> str:
    """Seconds as ``3d 4h``, ``2h 5m``, ``7m 3s`` or ``12s``: how the console and CLI show ages."""
    s = max(int(seconds), 0)
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60}m"
    if s >= 60:
        return f"{s // 60}m {s % 60}s"
    return f"{s}s"


def _duration(label: str, value: str) -> timedelta:
    try:
        parsed = parse_duration(value)
        if isinstance(parsed, str):  # ISO 8601: pydantic's to read
            from pydantic import TypeAdapter

            parsed = TypeAdapter(timedelta).validate_python(parsed)
        # Past about 2,000 years a moment before now is no datetime.
        if not isinstance(parsed, timedelta) or not timedelta(0) <= parsed < timedelta(
            days=730_000
        ):
            raise ValueError(f"not a duration from 0 to 2,000 years: {value[:40]!r}")
        return parsed
    except (ValueError, OverflowError) as e:
        raise SagaError(f"bad {label}: {str(e)[:200]}") from e
