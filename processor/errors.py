"""The processor's error tree.

Every error the pure core raises derives from :class:`SagaError`, so an adapter can translate
the whole family at its boundary with one ``except`` clause.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "ConfigurationError",
    "HandlerError",
    "IllegalTransition",
    "SagaDefinitionError",
    "SagaError",
    "SagaNotStarted",
    "UnknownMessageType",
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
        # Only the exception type goes in the message: the text of e.g. a pydantic error echoes
        # payload values, which may be personal data. The full cause stays on ``__cause__``.
        super().__init__(
            f"handler {handler_name!r} of saga {saga_type!r} (id {saga_id!r}) raised "
            f"{type(cause).__name__}"
        )


class SagaNotStarted(SagaError):
    """An event arrived for a saga instance that does not exist and cannot start one."""


class IllegalTransition(SagaError):
    """A state machine saga attempted a transition its definition does not allow."""
