"""Translation of psycopg errors into the runtime failures of :mod:`processor._errors`.

Every adapter in this package catches ``psycopg.Error`` at its boundary and raises
``translate(e) from e``, so the loops above decide from the failure class alone and never see a
driver type. The table follows the SQLSTATE classes, not psycopg's exception classes, because
the same Python class (``OperationalError``) covers both "try again" and "never works".
"""

from __future__ import annotations

import re

import psycopg

from processor._errors import (
    CommitInDoubt,
    LockBusy,
    RecordDataError,
    Retryable,
    RuntimeFailure,
    Unreachable,
)

__all__ = [
    "CITUS_COMMIT_FAILED",
    "CITUS_COPY_ERROR",
    "CITUS_RESULT_ERROR",
    "CITUS_WORKER_ERRORS",
    "CITUS_WORKER_LOST",
    "citus_copy_sqlstate",
    "translate",
    "unreachable",
    "unsharded",
]

# Connection lost (08), operator intervention such as a shutdown (57P), a statement cancelled by
# its timeout or an operator (57014), serialization failure and deadlock (40001, 40P01), lock
# wait timed out (55P03), insufficient resources (53), a Citus worker's failure whose class is
# lost (57000, see citus_copy_sqlstate): the same work may succeed on a later attempt.
_RETRYABLE = ("08", "57P", "57014", "57000", "40001", "40P01", "55P03", "53")
# Data exception (22), integrity constraint violation (23), program limit exceeded (54): the
# data of one write is refused; sending it again cannot help.
_RECORD_DATA = ("22", "23", "54")


# Citus writes the rows of an INSERT ... SELECT to its workers by COPY, and reports a worker's
# refusal of them from this function under SQLSTATE XX000 with the worker's message: the
# worker's SQLSTATE is lost (Citus 13, commands/multi_copy.c).
CITUS_COPY_ERROR = "ReportCopyError"

# The worker messages of the refusals a batch's rows can meet, by the SQLSTATE they had. The
# messages are PostgreSQL's in English: a worker set to another lc_messages falls to retrying.
_CITUS_COPY_REFUSALS = (
    ("duplicate key value violates unique constraint", "23505"),
    ("null value in column", "23502"),
    ("new row for relation", "23514"),
    ("index row size", "54000"),
    ("index row requires", "54000"),
    ("value too long for type", "22001"),
    ("invalid byte sequence", "22021"),
)


# A coordinator whose COMMIT of a transaction on a worker failed (the worker stopped, crashed
# or restarted after the transaction's statements) reports it from this function under SQLSTATE
# XX000, on a connection that stays usable (Citus 13, connection/placement_connection.c).
# The worker may have committed before its answer was lost: the outcome is unknown, as when the
# connection to a single PostgreSQL breaks during COMMIT.
CITUS_COMMIT_FAILED = "ErrorIfPostCommitFailedShardPlacements"

# A coordinator passes on a worker's error from this function with the worker's SQLSTATE, or
# with XX000 when the worker's answer had none: the coordinator's connection to the worker
# failed (the worker stopped or crashed mid-statement or mid-PREPARE: "server closed the
# connection unexpectedly", "SSL SYSCALL error: EOF detected").
CITUS_RESULT_ERROR = "ReportResultError"

# The coordinator functions that raise XX000 when its connection to a worker failed: the one
# above, and those that fail a transaction whose modifying connection to a worker broke
# ("failure on connection marked as essential"; read in Citus 13's
# transaction/remote_transaction.c, not provoked by the tests). That is an outage, not a fault
# of the statement: the same work may succeed once the worker is back.
CITUS_WORKER_LOST = frozenset(
    {CITUS_RESULT_ERROR, "MarkRemoteTransactionFailed", "CheckRemoteTransactionsHealth"}
)

# The coordinator functions that pass on a worker's error (a statement's result, copied rows).
CITUS_WORKER_ERRORS = frozenset({CITUS_RESULT_ERROR, CITUS_COPY_ERROR})

# A quoted name with a Citus shard id appended (shard ids start at 102008).
_SHARD_NAME = re.compile(r'"([^"]+)_\d{6,}"')


def unsharded(message: str) -> str:
    """A worker's message with its shards' names given back as the tables' (and indexes') own.

    A worker names the shard it wrote (``relation "holds_118508"``, ``"holds_pkey_118508"``);
    a dead letter's reason and a log line should name what an operator can find.
    """
    return _SHARD_NAME.sub(r'"\1"', message)


def citus_copy_sqlstate(message: str) -> str:
    """The SQLSTATE a worker's refusal had, read back from its message (see CITUS_COPY_ERROR).

    A message not known here is taken as transient (57000, operator intervention): the write is
    tried again and logged each time, where guessing "refused data" would dead-letter a batch's
    records while a worker is failing, and "fatal" would restart the replica again and again.
    """
    for prefix, state in _CITUS_COPY_REFUSALS:
        if message.startswith(prefix):
            return state
    return "57000"


def unreachable(e: BaseException) -> str | None:
    """One line saying the database could not be reached, when that is what ``e`` is.

    For a command line: a connection refused, timed out or dropped, raised by psycopg or already
    translated into a ``Retryable`` by an adapter; None for anything else.
    """
    if isinstance(e, psycopg.OperationalError) and (
        e.sqlstate is None or e.sqlstate.startswith(("08", "57P"))
    ):
        text = str(e).strip()
        first = text.splitlines()[0] if text else type(e).__name__
        return f"the database is unreachable: {first}"
    if isinstance(e, Retryable) and str(e).startswith("database unavailable"):
        return f"the database is unreachable: {e}"
    return None


# Undefined table (42P01), column (42703), schema (3F000): a statement names what the schema
# does not hold, because it was never migrated or is at an older migration than this code's.
NOT_MIGRATED = frozenset({"42P01", "42703", "3F000"})


def not_migrated(e: BaseException) -> str | None:
    """The server's message when ``e`` is a missing table, column or schema; else None.

    That is a SQLSTATE of :data:`NOT_MIGRATED`, on ``e`` or an error it was raised from: the
    adapters raise ``translate(e) from e``, so the causes are followed as well.
    """
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, psycopg.Error) and cause.sqlstate in NOT_MIGRATED:
            return cause.diag.message_primary or type(cause).__name__
        cause = cause.__cause__ or cause.__context__
    return None


def translate(e: psycopg.Error) -> RuntimeFailure:
    """The runtime failure that a psycopg error means for the loop that met it.

    Only the server's primary message is kept (``diag.message_primary``): the detail and the
    full text may echo the offending values, which can be personal data.

    Args:
        e: The error psycopg raised.

    Returns:
        ``Retryable`` for a transient failure (``Unreachable`` for a connection that failed,
        broke or was closed, ``LockBusy`` for a lock wait that timed out, ``CommitInDoubt`` for
        a COMMIT a Citus worker did not confirm),
        ``RecordDataError`` for refused data, and a plain
        ``RuntimeFailure`` (``Failure.FATAL``) for everything else.
    """
    state = e.sqlstate
    if state is None:
        # Raised by the client itself: a connection that failed, broke or was closed.
        if isinstance(e, psycopg.OperationalError):
            return Unreachable(f"database unavailable: {type(e).__name__}: {e}")
        return RuntimeFailure(f"database client error: {type(e).__name__}")
    primary = e.diag.message_primary or type(e).__name__
    source = e.diag.source_function
    if source in CITUS_WORKER_ERRORS:
        primary = unsharded(primary)
    if state == "XX000" and source == CITUS_COPY_ERROR:
        state = citus_copy_sqlstate(primary)
    if state == "XX000" and source == CITUS_COMMIT_FAILED:
        return CommitInDoubt(f"a Citus worker did not confirm the commit ({state}): {primary}")
    if state == "XX000" and source in CITUS_WORKER_LOST:
        return Retryable(f"a Citus worker's connection failed ({state}): {primary}")
    if state == "55P03":
        return LockBusy(f"rows busy ({state}): {primary}")
    if state.startswith(_RETRYABLE):
        return Retryable(f"database unavailable ({state}): {primary}")
    if state.startswith(_RECORD_DATA):
        return RecordDataError(state, primary)
    return RuntimeFailure(f"database error ({state}): {primary}")
