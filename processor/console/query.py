"""The console's query parameters read into what the inspect queries take, or a 400's reason.

Each parse names the parameter it refuses (``bad parameter older_than: ...``); the pages answer
400 with that line.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from processor.errors import SagaError
from processor.handles import SagaOutcome
from processor.ops.filters import state_documents
from processor.settings import parse_duration

__all__ = ["OUTCOMES", "REFRESH_CHOICES", "duration", "list_filters"]

OUTCOMES = tuple(o.value for o in SagaOutcome)
_STATUSES = ("active", "parked", "ended")
# Seconds between reloads the auto-refresh offers; anything else in `?refresh=` is ignored.
REFRESH_CHOICES = ("5", "10", "30", "60")


def list_filters(params: Mapping[str, str]) -> dict[str, Any]:
    """The sagas list's filters from its query string, as `InspectQueries.list_sagas` takes them.

    Raises:
        SagaError: A filter is malformed (a state search, an outcome, a duration or a cursor).
    """
    after = None
    try:
        if params.get("after"):
            at, saga_type, saga_id = params["after"].split("|", 2)
            after = (datetime.fromisoformat(at), saga_type, saga_id)
    except ValueError as e:
        raise SagaError(f"bad parameter after: {str(e)[:200]}") from e
    older = duration("older_than", params["older_than"]) if params.get("older_than") else None
    status = params.get("status") or None
    if status is not None and status not in _STATUSES:
        raise SagaError(f"bad parameter status: one of {', '.join(_STATUSES)}")
    outcome = params.get("outcome") or None
    if outcome is not None and outcome not in OUTCOMES:
        raise SagaError(f"bad parameter outcome: one of {', '.join(OUTCOMES)}")
    search = (params.get("attr") or "").strip()
    return {
        "saga_type": params.get("type") or None,
        "status": status,
        "machine_state": params.get("state") or None,
        "older_than": older,
        "after": after,
        "outcome": outcome,
        "correlation_id": (params.get("correlation") or "").strip() or None,
        "state_contains": state_documents(search) if search else [],
    }


def duration(name: str, value: str) -> timedelta:
    """The duration ``value`` of the parameter ``name``.

    Raises:
        SagaError: It is no duration the console can subtract from now.
    """
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
        raise SagaError(f"bad parameter {name}: {str(e)[:200]}") from e
