"""Translates psycopg errors into the runtime failures of :mod:`processor.errors`."""

from __future__ import annotations

import psycopg

from processor.errors import RecordDataError, Retryable, RuntimeFailure

# Connection exceptions, operator intervention, serialization failure, deadlock, lock not
# available, insufficient resources: the same work may succeed on another try.
_RETRYABLE = ("08", "57P", "40001", "40P01", "55P03", "53")
# Data exception, integrity constraint violation, program limit exceeded.
_RECORD_DATA = ("22", "23", "54")


def translate(e: psycopg.Error) -> RuntimeFailure:
    """The runtime failure for a psycopg error, by its SQLSTATE class; raise it ``from e``."""
    state = e.sqlstate or ""
    if state.startswith(_RETRYABLE):
        return Retryable(f"database error {state}: {e}")
    if state.startswith(_RECORD_DATA):
        return RecordDataError(state, e.diag.message_primary or type(e).__name__)
    return RuntimeFailure(f"database error {state or '(no SQLSTATE)'}: {e}")
