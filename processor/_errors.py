"""The processor's error tree.

Every error the pure core raises derives from :class:`SagaError`, so an adapter can translate
the whole family at its boundary with one ``except`` clause.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from pydantic import ValidationError

__all__ = [
    "CommitInDoubt",
    "ConcurrentUpdate",
    "ConfigurationError",
    "DeliveryFailed",
    "Failure",
    "Fenced",
    "FencedOut",
    "HandlerError",
    "IllegalTransition",
    "LockBusy",
    "LoopDied",
    "RecordDataError",
    "Refused",
    "Retryable",
    "RuntimeFailure",
    "SagaDefinitionError",
    "SagaError",
    "SagaNotStarted",
    "SchemaNotMigrated",
    "SendFailure",
    "UnknownMessageType",
    "Unreachable",
    "classify",
    "describe_error",
]


class SagaError(Exception):
    """Base class of every error raised by the saga processor."""


class _ProblemList(SagaError):
    """An error that reports several independent problems at once.

    Authors fix a saga faster when they see every mistake in one run instead of one per restart,
    so validators collect problems and raise once.
    """

    headline = "problems found"

    def __init__(self, problems: Iterable[str], *, subject: str | None = None) -> None:
        self.problems: list[str] = list(problems)
        self.subject = subject
        title = f"{subject}: {self.headline}" if subject else self.headline.capitalize()
        lines = [f"{title} ({len(self.problems)}):"]
        lines.extend(f"  - {problem}" for problem in self.problems)
        super().__init__("\n".join(lines))


class SagaDefinitionError(_ProblemList):
    """A saga or message class is declared wrongly; raised at import time.

    Attributes:
        problems: One line per problem, each naming the fix.
    """

    headline = "invalid saga definition"


class ConfigurationError(_ProblemList):
    """Startup binding failed: a setting or dependency a handler asks for is missing or invalid.

    Attributes:
        problems: One line per problem, each naming the fix.
    """

    headline = "invalid configuration"


class UnknownMessageType(SagaError):
    """No message class is registered under the requested name, version or class."""


def describe_error(error: BaseException) -> str:
    """The error's type and where it happened, without the values it was given.

    A pydantic ``ValidationError`` is reduced to its field locations and messages (its text
    echoes the input, which may hold personal data); other errors keep their message, which is
    the code's own text.
    """
    if isinstance(error, ValidationError):
        details = error.errors(include_input=False, include_url=False, include_context=False)
        where = "; ".join(
            f"{'.'.join(map(str, d['loc'])) or '<root>'}: {d['msg']}" for d in details[:10]
        )
        more = f" (+{len(details) - 10} more)" if len(details) > 10 else ""
        return f"ValidationError at {where}{more}"
    return f"{type(error).__name__}: {error}"


class HandlerError(SagaError):
    """A user handler raised; the original exception is kept as ``cause`` and ``__cause__``.

    Attributes:
        saga_type: Type name of the saga whose handler failed.
        saga_id: Id of the saga instance.
        handler_name: Name of the handler function.
        cause: The exception the handler raised.
    """

    def __init__(self, saga_type: str, saga_id: str, handler_name: str, cause: BaseException):
        self.saga_type = saga_type
        self.saga_id = saga_id
        self.handler_name = handler_name
        self.cause = cause
        # The same text a parked saga's reason shows: a pydantic error is reduced to where it
        # failed (its text echoes payload values, which may be personal data). The full cause
        # stays on ``__cause__``.
        super().__init__(
            f"handler {handler_name!r} of saga {saga_type!r} (id {saga_id!r}) raised "
            f"{describe_error(cause)}"
        )


class SagaNotStarted(SagaError):
    """An event arrived for a saga instance that does not exist and cannot start one."""


class IllegalTransition(SagaError):
    """A state machine saga attempted a transition its definition does not allow."""


class Refused(SagaError):
    """An operator's request was understood and the answer is no: nothing was changed.

    No such saga or dead letter, a saga that is not parked, no row matching the selection. The
    command line exits 1 on it, 2 on every other ``SagaError`` (a usage or configuration
    mistake).
    """


class SchemaNotMigrated(Refused):
    """The database schema lacks the processor's tables (never migrated, or by an older release).

    Raised where a command finds that before it reads them (`check`); the command line reads a
    missing table, column or schema that the database reported the same way, and names the fix:
    `saga-processor migrate`.
    """


# -- runtime failures ---------------------------------------------------------------------------
# The loops never look at driver exceptions: the adapters translate every psycopg and
# confluent_kafka error into one of the classes below at their boundary, and each loop decides
# what to do from the class alone. One table, here, says which failure gets which treatment.


class Failure(StrEnum):
    """What a runtime failure means for the loop that met it."""

    RETRYABLE = "retryable"
    """Connection lost, serialization failure, broker unavailable: back off, resync, go on."""
    FENCED = "fenced"
    """Epoch moved, lease lost, stale token: drop the work, resync, go on."""
    RECORD_DATA = "record-data"
    """One record's data cannot be stored: dead-letter that record alone, go on."""
    SAGA_CODE = "saga-code"
    """One saga's code or state fails: park that saga, go on."""
    ROW_REFUSED = "row-refused"
    """A downstream refuses one outgoing record for good: set that row aside, go on."""
    FATAL = "fatal"
    """A loop cannot go on (misconfiguration, a bug): log, exit non-zero, let the platform
    restart the process."""


class RuntimeFailure(SagaError):
    """Base of every failure the runtime's adapters raise; ``kind`` decides the action."""

    default_kind: ClassVar[Failure] = Failure.FATAL

    @property
    def kind(self) -> Failure:
        """The failure class of this error."""
        return self.default_kind


class Retryable(RuntimeFailure):
    """A transient failure of the database or the broker; the same work may be tried again."""

    default_kind = Failure.RETRYABLE


class Unreachable(Retryable):
    """The database itself did not answer: no connection could be opened, or the one held broke.

    Other transient failures come from a database that answers (a lock wait or a statement
    timed out, a Citus worker behind the coordinator failed): other work may succeed meanwhile.
    Nothing can while this one lasts.
    """


class LockBusy(Retryable):
    """Rows another session holds did not come free in time; the database itself answers.

    E.g. a partition's previous owner is still publishing its outbox rows: its ownership claim
    is tried again later, and the database does not count as unavailable.
    """


class CommitInDoubt(Retryable):
    """The connection broke while a transaction was committing: the outcome is unknown.

    It is known again once the stored offsets are read back.
    """


class Fenced(RuntimeFailure):
    """Another owner holds the work now: an epoch moved, a lease was lost, a token is stale."""

    default_kind = Failure.FENCED


class FencedOut(Fenced):
    """This replica no longer owns some partitions: its batch must not commit.

    Attributes:
        partitions: The (topic, partition) pairs owned by another replica now.
    """

    def __init__(self, partitions: Iterable[tuple[str, int]]) -> None:
        self.partitions = sorted(partitions)
        super().__init__(f"partitions owned by another replica now: {self.partitions}")


class ConcurrentUpdate(Fenced):
    """A saga row changed under the batch (an operator's retry, or a zombie's late write)."""


class RecordDataError(RuntimeFailure):
    """The database refused the data of a write (SQLSTATE classes 22, 23, 54).

    Attributes:
        sqlstate: The database's error code.
        reason: The database's message, without the offending values where it can be told.
    """

    default_kind = Failure.RECORD_DATA

    def __init__(self, sqlstate: str | None, reason: str) -> None:
        self.sqlstate = sqlstate
        self.reason = reason
        super().__init__(f"data refused by the database ({sqlstate}): {reason}")


class DeliveryFailed(RuntimeFailure):
    """Records were not acknowledged by the broker.

    Attributes:
        failures: One :class:`SendFailure` per record that failed, by its position.
    """

    def __init__(self, failures: Sequence[SendFailure]) -> None:
        self.failures = list(failures)
        permanent = any(f.permanent for f in self.failures)
        first = self.failures[0] if self.failures else None
        super().__init__(
            f"{len(self.failures)} records not acknowledged"
            + (f"; first: {first.reason}" if first else "")
        )
        self.permanent = permanent

    @property
    def kind(self) -> Failure:
        """Refused for good when any record can never be sent; else worth another try."""
        return Failure.ROW_REFUSED if self.permanent else Failure.RETRYABLE


@dataclass(frozen=True, slots=True)
class SendFailure:
    """Why one outgoing record was not acknowledged.

    Attributes:
        index: Position of the record in the batch that was sent.
        reason: The client's error, as text (never the record's content).
        permanent: True when sending the same record again cannot succeed (too large, unknown
            topic, not authorized).
    """

    index: int
    reason: str
    permanent: bool


class LoopDied(RuntimeFailure):
    """A background loop of the process stopped on an error it could not classify."""

    default_kind = Failure.FATAL


def classify(error: BaseException) -> Failure:
    """The failure class of any exception a loop catches; unknown ones are fatal."""
    if isinstance(error, RuntimeFailure):
        return error.kind
    if isinstance(error, HandlerError):
        return Failure.SAGA_CODE
    return Failure.FATAL


class SchemaRefused(SagaError):
    """The Schema Registry refused a schema: incompatible with its subject's, or invalid."""
