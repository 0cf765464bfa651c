"""Translates psycopg's exceptions into the runtime failure classes, by SQLSTATE."""

from __future__ import annotations

import psycopg

from processor.errors import RecordDataError, Retryable, RuntimeFailure

# Connection exceptions (08), operator intervention such as a shutdown or a cancelled session
# (57P), serialization failures and deadlocks (40), lock not available (55P03), insufficient
# resources (53): the same work may succeed on a later try.
_RETRYABLE_PREFIXES = ("08", "57P", "40", "55P03", "53")
# Data exceptions (22), integrity constraint violations (23), program limits exceeded (54): the
# data itself is refused, and will be again.
_DATA_PREFIXES = ("22", "23", "54")


def translate(error: psycopg.Error) -> RuntimeFailure:
    """The runtime failure that ``error`` means; never echoes the offending values."""
    state = error.sqlstate or ""
    if isinstance(error, psycopg.OperationalError) and not state:
        # No SQLSTATE: the client lost the server (closed socket, failed connect).
        return Retryable(f"database unreachable: {type(error).__name__}")
    if state.startswith(_RETRYABLE_PREFIXES):
        return Retryable(f"database error {state}: {type(error).__name__}")
    if state.startswith(_DATA_PREFIXES):
        # The primary message names the constraint or the limit; the detail line would show
        # the offending values, which may be personal data.
        return RecordDataError(state, error.diag.message_primary or type(error).__name__)
    return RuntimeFailure(f"database error {state or '?'}: {type(error).__name__}")
