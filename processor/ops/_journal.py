"""A saga function's journal, as `show` and the console's saga page show it.

Read from the stored state alone, by its shape (a ``journal`` list beside a ``pending`` key, as
:class:`processor._authoring.functions.FunctionState` stores them), so a saga whose class this
process does not load is shown all the same. Payloads are left out: the rows name each command
and reply by its wire name, and the state below them holds the rest for those who may read it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import TypeAdapter, ValidationError

from processor._ports.views import FunctionJournal, JournalEntry, PendingAwait

__all__ = ["function_journal"]

_DURATION: TypeAdapter[timedelta] = TypeAdapter(timedelta)


def function_journal(state: dict[str, Any] | None) -> FunctionJournal | None:
    """The journal of a saga function's state; None for any other state."""
    stored = state or {}
    journal = stored.get("journal")
    if not isinstance(journal, list) or "pending" not in stored:
        return None
    pending = stored.get("pending")
    return FunctionJournal(
        entries=[_entry(e) for e in journal if isinstance(e, dict)],
        pending=_pending(pending) if isinstance(pending, dict) else None,
        compensating=stored.get("compensating") is True,
        aborted=_text(stored.get("aborted")),
        deadline_at=_time(stored.get("deadline_at")),
        late=[n for n in stored.get("late") or [] if isinstance(n, str)],
    )


def _entry(e: dict[str, Any]) -> JournalEntry:
    result = e.get("result")
    return JournalEntry(
        seq=_number(e.get("seq")) or 0,
        kind=_text(e.get("kind")) or "?",
        what=_text(e.get("what")) or "?",
        outcome=_text(e.get("outcome")) or "ok",
        attempts=_number(e.get("attempts")) or 1,
        at=_time(e.get("at")),
        reply=_text(result.get("type")) if isinstance(result, dict) else None,
        decision=_text(e.get("decision")),
    )


def _pending(p: dict[str, Any]) -> PendingAwait:
    retry = p.get("retry")
    return PendingAwait(
        seq=_number(p.get("seq")) or 0,
        kind=_text(p.get("kind")) or "?",
        what=_text(p.get("what")) or "?",
        attempt=_number(p.get("attempt")) or 1,
        max_attempts=_number(retry.get("max_attempts")) if isinstance(retry, dict) else None,
        since=_time(p.get("since")),
        timeout=_duration(p.get("timeout")),
        timer_at=_time(p.get("timer_at")),
        backing_off=p.get("backing_off") is True,
        expects=[n for n in p.get("expects") or [] if isinstance(n, str)],
        reason=_text(p.get("reason")),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _number(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _time(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def _duration(value: object) -> timedelta | None:
    # Stored as pydantic writes a timedelta: ISO 8601 (``PT10S``).
    if value is None:
        return None
    try:
        return _DURATION.validate_python(value)
    except ValidationError:
        return None
