"""Per-invocation handles injected into saga handlers.

Handles never perform I/O: they only record what the handler intends. The runtime writes the
recorded intents together with the new saga state in one transaction, which is why a failed
handler or a failed commit can never leave a command or a deadline behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from pydantic import TypeAdapter

from processor._authoring.messages import Message, MessageRegistry, registry
from processor._errors import SagaError, UnknownMessageType

__all__ = [
    "CancelDeadline",
    "CommandIntent",
    "DeadlineOp",
    "SagaCommands",
    "SagaDeadlines",
    "SagaLifecycle",
    "SagaOutcome",
    "ScheduleDeadline",
    "Setting",
]

_MISSING: Any = object()
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})
_new = object.__new__


def _require_aware(value: datetime, what: str) -> None:
    # Naive datetimes are ambiguous across machines in different zones; a deadline stored in
    # Postgres as timestamptz must be an absolute instant.
    if value.tzinfo is None or value.utcoffset() is None:
        raise SagaError(f"{what} must be timezone-aware, e.g. datetime.now(UTC); got {value!r}")


@dataclass(frozen=True)
class CommandIntent:
    """A command a handler asked to send.

    Attributes:
        message: The command.
        topic: Destination topic.
        key: Record key (the saga id unless overridden).
        headers: Extra headers the handler supplied.
        deadline_unix_ms: Absolute budget for the receiver, in Unix milliseconds, if any.
    """

    message: Message
    topic: str
    key: str
    headers: Mapping[str, str]
    deadline_unix_ms: int | None


class SagaCommands:
    """Records commands for the runtime to send once the handler's effects commit."""

    def __init__(self, saga_id: str, *, registry: MessageRegistry = registry) -> None:
        """Create an empty buffer for one handler invocation.

        Args:
            saga_id: Default record key of sent commands.
            registry: Registry that supplies each command class's default topic.
        """
        self._saga_id = saga_id
        self._registry = registry
        self._intents: list[CommandIntent] = []

    def send(
        self,
        command: Message,
        *,
        topic: str | None = None,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        deadline: datetime | None = None,
    ) -> None:
        """Send ``command`` after the handler commits.

        Args:
            command: A registered :class:`Message` instance.
            topic: Destination; defaults to the topic registered for the command's class.
            key: Record key; defaults to the saga id so all commands of a saga share a partition.
            headers: Extra string headers.
            deadline: Timezone-aware instant after which the receiver should not start the work;
                sent as the ``deadline-unix-ms`` header.

        Raises:
            SagaError: The command is not a Message, no topic is known, or the deadline is naive.
        """
        if not isinstance(command, Message):
            raise SagaError(f"commands.send() takes a Message instance, got {type(command)!r}")
        if topic is None:
            try:
                topic = self._registry.of(type(command)).topic
            except UnknownMessageType:
                topic = None
            if topic is None:
                raise SagaError(
                    f"no topic for {type(command).__qualname__}: pass topic=... or register "
                    "the class with @message_type(..., topic=...)"
                )
        deadline_ms: int | None = None
        if deadline is not None:
            _require_aware(deadline, "deadline")
            deadline_ms = int(deadline.timestamp() * 1000)
        # CommandIntent is frozen for the handlers that read it back; its generated __init__
        # sets each field through object.__setattr__, once per command on the hot path. Filling
        # the new instance's __dict__ makes the same object (no __post_init__; a unit test checks
        # that every field is set here).
        intent = _new(CommandIntent)
        intent.__dict__.update(
            message=command,
            topic=topic,
            key=self._saga_id if key is None else key,
            headers=MappingProxyType(dict(headers)) if headers else _NO_HEADERS,
            deadline_unix_ms=deadline_ms,
        )
        self._intents.append(intent)

    @property
    def intents(self) -> list[CommandIntent]:
        """Commands recorded so far, in call order (a copy)."""
        return list(self._intents)


@dataclass(frozen=True)
class ScheduleDeadline:
    """Schedule (or reschedule) deadline ``name``.

    Attributes:
        name: Deadline name, unique per saga instance.
        due_at: Absolute, timezone-aware due time.
        payload: JSON-compatible form of the payload, or None.
    """

    name: str
    due_at: datetime
    payload: Any


@dataclass(frozen=True)
class CancelDeadline:
    """Cancel deadline ``name``; the store treats an absent deadline as a no-op.

    Attributes:
        name: Deadline name.
    """

    name: str


DeadlineOp = ScheduleDeadline | CancelDeadline


class SagaDeadlines:
    """Records deadline schedules and cancellations for the current saga instance."""

    def __init__(self, now: datetime) -> None:
        """Create an empty buffer.

        Args:
            now: The invocation's clock reading; ``after=`` is measured from it.
        """
        _require_aware(now, "now")
        self._now = now
        self._ops: list[DeadlineOp] = []

    def schedule(
        self,
        name: str,
        after: timedelta | None = None,
        payload: object = None,
        *,
        at: datetime | None = None,
    ) -> None:
        """Schedule deadline ``name`` to fire ``after`` from now, or ``at`` an instant.

        Scheduling a name that is already scheduled replaces it.

        Args:
            name: Deadline name; a ``@saga_deadline_handler(name)`` must exist for it to fire.
            after: Delay from now. Exactly one of ``after`` and ``at`` is required.
            payload: Any pydantic-serialisable value, delivered to the deadline handler.
            at: Timezone-aware due instant.

        Raises:
            SagaError: Both or neither of ``after``/``at``, a wrong type, or a naive ``at``.
        """
        if not isinstance(name, str) or not name:
            raise SagaError(f"deadline name must be a non-empty string, got {name!r}")
        if isinstance(after, datetime):
            # datetime is not a timedelta, but the mistake is common enough to name the fix.
            raise SagaError(
                f"deadline {name!r}: after= takes a timedelta; for an instant use at=datetime"
            )
        if (after is None) == (at is None):
            raise SagaError(f"deadline {name!r}: pass exactly one of after=timedelta or at=")
        if after is not None:
            if not isinstance(after, timedelta):
                raise SagaError(
                    f"deadline {name!r}: after= takes a timedelta, got {type(after).__name__}"
                )
            due_at = self._now + after
        else:
            assert at is not None
            if not isinstance(at, datetime):
                raise SagaError(f"deadline {name!r}: at= takes a datetime, got {type(at).__name__}")
            _require_aware(at, f"deadline {name!r}: at")
            due_at = at
        encoded = None if payload is None else _to_json(payload)
        if self._ops:
            # Only the last schedule of a name in one invocation matters; dropping earlier ones
            # keeps the store's work (delete then insert) to one row per name.
            self._ops = [
                op for op in self._ops if not (isinstance(op, ScheduleDeadline) and op.name == name)
            ]
        # As for CommandIntent in SagaCommands.send: the same frozen object, built directly.
        op = _new(ScheduleDeadline)
        op.__dict__.update(name=name, due_at=due_at, payload=encoded)
        self._ops.append(op)

    def cancel(self, name: str) -> None:
        """Cancel deadline ``name``; a no-op when it is not scheduled.

        Args:
            name: Deadline name.
        """
        if not isinstance(name, str) or not name:
            raise SagaError(f"deadline name must be a non-empty string, got {name!r}")
        self._ops.append(CancelDeadline(name=name))

    @property
    def now(self) -> datetime:
        """The invocation's clock reading."""
        return self._now

    @property
    def operations(self) -> list[DeadlineOp]:
        """Schedules and cancellations recorded so far, in call order (a copy)."""
        return list(self._ops)


def _to_json(payload: object) -> Any:
    try:
        return TypeAdapter(type(payload)).dump_python(payload, mode="json")
    except Exception as e:
        raise SagaError(
            f"deadline payload of type {type(payload).__qualname__} is not serialisable to "
            "JSON; use a pydantic model, dataclass or plain data"
        ) from e


class SagaOutcome(StrEnum):
    """How a saga ended, as operators, the CLI, the console and the metrics see it.

    Stored in the saga's ``machine_state`` column once it ends (while it runs, that column
    holds a state machine's current state).
    """

    COMPLETED = "COMPLETED"
    """It did what it was for."""
    COMPENSATED = "COMPENSATED"
    """It could not finish, and every step it had completed was undone (at least one undo ran,
    every undo succeeded or a person marked it done by hand)."""
    FAILED = "FAILED"
    """It could not finish, and no undo ran: nothing had been done that needed one, or a ``fail``
    policy stopped it as it stood."""
    COMPENSATION_FAILED = "COMPENSATION_FAILED"
    """It could not, and an undo failed too, with nobody asked to finish it (an orchestrated
    saga asks a person instead and keeps WAITING; see ``OrchestratedSaga.resolve``)."""
    TIMED_OUT = "TIMED_OUT"
    """Its deadline passed first."""
    CANCELLED = "CANCELLED"
    """An operator cancelled it and its compensation ran."""
    TERMINATED = "TERMINATED"
    """An operator ended it as it stood, undoing nothing."""


class SagaLifecycle:
    """Lets a handler end its saga conditionally, saying how it ended."""

    def __init__(self) -> None:
        self._ended = False
        self._outcome: SagaOutcome | None = None
        self._escalated: str | None = None

    def end(self, outcome: SagaOutcome | str | None = None) -> None:
        """End the saga once the handler commits; its deadlines are cancelled by the store.

        Args:
            outcome: How it ended (a :class:`SagaOutcome` or its name); ``COMPLETED`` when
                not given (``CANCELLED`` in a cancel handler).

        Raises:
            ValueError: ``outcome`` is not a :class:`SagaOutcome`.
        """
        self._ended = True
        self._outcome = None if outcome is None else SagaOutcome(outcome)

    @property
    def ended(self) -> bool:
        """Whether :meth:`end` was called."""
        return self._ended

    @property
    def outcome(self) -> SagaOutcome | None:
        """The outcome given to :meth:`end`, if any."""
        return self._outcome

    def escalate(self, reason: str) -> None:
        """Hand the saga to a person: it stays active, ``WAITING``, until a handler runs again.

        The handler's commands are still sent (typically the one that tells the person). The
        saga shows as ``WAITING`` with ``reason`` in ``sagas list``, ``sagas stuck``, ``show``
        and the console; the next event or deadline it handles resumes it, and so does an
        operator's ``saga resolve`` when the saga declares a ``@saga_decision_handler``.

        Args:
            reason: Why, for the person (no payload values: it is shown to operators).
        """
        if not reason.strip():
            raise ValueError("say why the saga needs a person")
        self._escalated = reason

    @property
    def escalated(self) -> str | None:
        """The reason given to :meth:`escalate`, if it was called."""
        return self._escalated


class Setting:
    """Marks a handler parameter as a configuration value.

    Example:
        ``max_amount: Annotated[Decimal, Setting("transfer.max-amount")]``

    Attributes:
        key: The settings key.
        default: Value used when the key is absent at startup; absent means required.
    """

    __slots__ = ("default", "key")

    def __init__(self, key: str, *, default: Any = _MISSING) -> None:
        """Create the marker.

        Args:
            key: The settings key, e.g. ``"transfer.payment-timeout"``.
            default: Value used when the key is not configured.
        """
        if not isinstance(key, str) or not key:
            raise SagaError(f"Setting key must be a non-empty string, got {key!r}")
        self.key = key
        self.default = default

    @property
    def has_default(self) -> bool:
        """Whether a default was given."""
        return self.default is not _MISSING

    def __repr__(self) -> str:
        extra = f", default={self.default!r}" if self.has_default else ""
        return f"Setting({self.key!r}{extra})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Setting):
            return NotImplemented
        return (self.key, self.has_default, self.default) == (
            other.key,
            other.has_default,
            other.default,
        )

    def __hash__(self) -> int:
        return hash(self.key)
