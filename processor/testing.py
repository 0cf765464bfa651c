"""In-memory saga test fixture with virtual time: no Kafka, no PostgreSQL, no sleeping.

Example:
    >>> fixture = SagaFixture(TransferSaga)  # doctest: +SKIP
    >>> fixture.given(TransferRequested(...))  # doctest: +SKIP
    >>> fixture.when_time_elapses(timedelta(minutes=30)).expect_commands(
    ...     ReverseDebit(...)
    ... ).expect_ended().expect_no_deadlines()  # doctest: +SKIP

The fixture runs handlers through the same :class:`~processor.runner.BoundSaga` the engine uses
and applies the outcomes with the store's rules: scheduling a name replaces it, cancelling an
absent name does nothing, a fired deadline is removed before its handler's own operations apply,
ending removes every deadline, and events for an ended saga are recorded and ignored.
"""

from __future__ import annotations

import difflib
import pprint
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Self

from processor.definition import SagaState, definition_of
from processor.errors import UnknownMessageType
from processor.handles import CommandIntent, DeadlineOp, ScheduleDeadline
from processor.messages import Message, MessageMetadata, registry
from processor.runner import DeadlineInput, EventInput, Outcome, bind

__all__ = ["DEFAULT_START_TIME", "Result", "SagaFixture"]

DEFAULT_START_TIME = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class _Pending:
    due_at: datetime
    payload: Any
    deadline_id: str


@dataclass
class _Instance:
    state: SagaState
    ended: bool = False
    deadlines: dict[str, _Pending] = field(default_factory=dict)


def _diff(expected: object, actual: object) -> str:
    lines = difflib.unified_diff(
        pprint.pformat(expected, width=88).splitlines(),
        pprint.pformat(actual, width=88).splitlines(),
        "expected",
        "actual",
        lineterm="",
    )
    return "\n".join(lines)


@dataclass
class Result:
    """What one ``when`` step did, with chainable expectations.

    Attributes:
        saga_id: Id of the saga instance the step applied to (the fixture's for time steps).
        command_intents: Commands sent, with topic, key and headers.
        deadline_ops: ``(operation, invoked_at)`` for each schedule and cancel, in order.
        fired: Names of the deadlines that fired during the step.
        ignored: True when the event was ignored (saga ended or never started).
        ended: Whether the saga has ended after the step.
        state: The saga's state after the step (None if it never started).
        pending: Deadlines pending after the step, name to due time.
    """

    saga_id: str | None
    command_intents: list[CommandIntent]
    deadline_ops: list[tuple[DeadlineOp, datetime]]
    fired: list[str]
    ignored: bool
    ended: bool
    state: SagaState | None
    pending: dict[str, datetime]

    @property
    def commands(self) -> list[Message]:
        """The sent commands' messages, in order."""
        return [intent.message for intent in self.command_intents]

    def expect_commands(self, *expected: Message) -> Self:
        """Assert exactly these commands were sent, in this order."""
        if list(expected) != self.commands:
            raise AssertionError("commands differ:\n" + _diff(list(expected), self.commands))
        return self

    def expect_no_commands(self) -> Self:
        """Assert no command was sent."""
        if self.commands:
            raise AssertionError(f"expected no commands, got:\n{pprint.pformat(self.commands)}")
        return self

    def expect_deadline_scheduled(
        self, name: str, *, at: datetime | None = None, after: timedelta | None = None
    ) -> Self:
        """Assert deadline ``name`` was scheduled in this step (the last schedule counts).

        Args:
            name: Deadline name.
            at: Expected absolute due time.
            after: Expected delay from the moment the scheduling handler ran.
        """
        scheduled = [
            (op, invoked)
            for op, invoked in self.deadline_ops
            if isinstance(op, ScheduleDeadline) and op.name == name
        ]
        if not scheduled:
            names = [op.name for op, _ in self.deadline_ops if isinstance(op, ScheduleDeadline)]
            raise AssertionError(f"deadline {name!r} was not scheduled; scheduled: {names}")
        op, invoked = scheduled[-1]
        if at is not None and op.due_at != at:
            raise AssertionError(f"deadline {name!r} is due at {op.due_at}, expected {at}")
        if after is not None and op.due_at - invoked != after:
            raise AssertionError(
                f"deadline {name!r} is due {op.due_at - invoked} after scheduling, expected {after}"
            )
        return self

    def expect_no_deadlines(self) -> Self:
        """Assert no deadline is pending after this step."""
        if self.pending:
            raise AssertionError(f"expected no pending deadlines, got {self.pending}")
        return self

    def expect_no_deadline(self, name: str) -> Self:
        """Assert deadline ``name`` is not pending after this step."""
        if name in self.pending:
            raise AssertionError(f"deadline {name!r} is still pending, due {self.pending[name]}")
        return self

    def expect_ended(self) -> Self:
        """Assert the saga has ended."""
        if not self.ended:
            raise AssertionError(f"expected the saga to have ended; it is active: {self.state!r}")
        return self

    def expect_active(self) -> Self:
        """Assert the saga exists and has not ended."""
        if self.ended or self.state is None:
            what = "ended" if self.ended else "never started"
            raise AssertionError(f"expected an active saga; it {what}")
        return self

    def expect_state(self, **fields: Any) -> Self:
        """Assert the given state fields have the given values."""
        if self.state is None:
            raise AssertionError("the saga never started, so it has no state")
        known = type(self.state).model_fields
        unknown = sorted(set(fields) - set(known))
        if unknown:
            raise AssertionError(f"no such state field(s) {unknown}; fields: {sorted(known)}")
        actual = {name: getattr(self.state, name) for name in fields}
        if actual != fields:
            raise AssertionError("state differs:\n" + _diff(fields, actual))
        return self


class SagaFixture:
    """Drives one saga class in memory with a virtual clock.

    Attributes:
        now: The virtual clock.
        ignored: Events ignored because their saga had ended or never started.
    """

    def __init__(
        self,
        saga_cls: type[SagaState],
        *,
        saga_id: str | None = None,
        settings: Mapping[str, Any] | None = None,
        dependencies: Mapping[type, object] | None = None,
        start_time: datetime = DEFAULT_START_TIME,
    ) -> None:
        """Bind the saga exactly as the processor would at startup.

        Args:
            saga_cls: A class decorated with ``@saga``.
            saga_id: The instance the fixture reports on; defaults to the first event's
                association value.
            settings: Settings for ``Setting`` parameters.
            dependencies: Dependencies by type.
            start_time: Initial virtual time (timezone-aware).
        """
        if start_time.tzinfo is None:
            raise ValueError("start_time must be timezone-aware")
        self.definition = definition_of(saga_cls)
        self.bound = bind(self.definition, settings=settings, dependencies=dependencies)
        self.saga_id = saga_id
        self.now = start_time
        self.ignored: list[Message] = []
        self._instances: dict[str, _Instance] = {}
        self._seq = 0

    @property
    def state(self) -> SagaState | None:
        """State of the fixture's saga instance, or None before it starts."""
        instance = self._instances.get(self.saga_id or "")
        return instance.state if instance else None

    @property
    def ended(self) -> bool:
        """Whether the fixture's saga instance has ended."""
        instance = self._instances.get(self.saga_id or "")
        return bool(instance and instance.ended)

    @property
    def pending_deadlines(self) -> dict[str, datetime]:
        """Deadlines pending on the fixture's saga instance, name to due time."""
        instance = self._instances.get(self.saga_id or "")
        return {n: p.due_at for n, p in instance.deadlines.items()} if instance else {}

    def given(self, *events: Message) -> Self:
        """Apply ``events`` in order as history; returns the fixture for chaining."""
        for event in events:
            self.when(event)
        return self

    def when(self, event: Message, *, metadata: MessageMetadata | None = None) -> Result:
        """Deliver ``event`` at the current virtual time.

        Args:
            event: The event; its association value picks the saga instance.
            metadata: Metadata to inject; a plausible one is made up when omitted.
        """
        if not self.definition.handles(type(event)):
            raise AssertionError(
                f"{self.definition.state_cls.__qualname__} has no handler for "
                f"{type(event).__qualname__}"
            )
        saga_id = self.definition.association_value(event)
        if saga_id is None:
            raise AssertionError(
                f"{type(event).__qualname__} has no association value; the processor would "
                "dead-letter it"
            )
        if self.saga_id is None:
            self.saga_id = saga_id
        self._seq += 1
        instance = self._instances.get(saga_id)
        handler = self.definition.event_handlers[type(event)]
        if (instance is not None and instance.ended) or (instance is None and not handler.start):
            self.ignored.append(event)
            return self._result(saga_id, [], ignored=True)
        meta = metadata or self._metadata(event, saga_id)
        outcome = self.bound.handle_event(
            instance.state if instance else None, saga_id, EventInput(event, meta), self.now
        )
        self._apply(saga_id, outcome)
        return self._result(saga_id, [(outcome, self.now, None)])

    def when_time_elapses(self, delta: timedelta) -> Result:
        """Advance the virtual clock by ``delta``, firing every deadline that comes due.

        Deadlines fire in due order (ties in scheduling order), each with the clock set to its
        due time, so deadlines their handlers schedule are measured from that moment and fire
        within the same step if they come due before the end of it.
        """
        if delta < timedelta(0):
            raise ValueError("time only moves forward")
        target = self.now + delta
        runs: list[tuple[Outcome, datetime, str | None]] = []
        while (due := self._next_due(target)) is not None:
            saga_id, name, pending = due
            instance = self._instances[saga_id]
            self.now = max(self.now, pending.due_at)
            # The store deletes a deadline when its handler runs; the handler may reschedule it.
            del instance.deadlines[name]
            outcome = self.bound.handle_deadline(
                instance.state,
                saga_id,
                DeadlineInput(name, pending.deadline_id, pending.payload, pending.due_at),
                self.now,
            )
            self._apply(saga_id, outcome)
            runs.append((outcome, self.now, name))
        self.now = target
        return self._result(self.saga_id, runs)

    def _next_due(self, target: datetime) -> tuple[str, str, _Pending] | None:
        candidates = [
            (p.due_at, int(p.deadline_id), saga_id, name, p)
            for saga_id, instance in self._instances.items()
            if not instance.ended
            for name, p in instance.deadlines.items()
            if p.due_at <= target
        ]
        if not candidates:
            return None
        _, _, saga_id, name, pending = min(candidates, key=lambda c: (c[0], c[1]))
        return saga_id, name, pending

    def _apply(self, saga_id: str, outcome: Outcome) -> None:
        instance = self._instances.setdefault(saga_id, _Instance(outcome.state))
        instance.state = outcome.state
        for op in outcome.deadlines:
            if isinstance(op, ScheduleDeadline):
                self._seq += 1
                instance.deadlines[op.name] = _Pending(op.due_at, op.payload, str(self._seq))
            else:
                instance.deadlines.pop(op.name, None)
        if outcome.ended:
            instance.ended = True
            instance.deadlines.clear()

    def _result(
        self,
        saga_id: str | None,
        runs: list[tuple[Outcome, datetime, str | None]],
        *,
        ignored: bool = False,
    ) -> Result:
        instance = self._instances.get(saga_id or "")
        return Result(
            saga_id=saga_id,
            command_intents=[c for outcome, _, _ in runs for c in outcome.commands],
            deadline_ops=[(op, at) for outcome, at, _ in runs for op in outcome.deadlines],
            fired=[name for _, _, name in runs if name is not None],
            ignored=ignored,
            ended=bool(instance and instance.ended),
            state=instance.state.model_copy(deep=True) if instance else None,
            pending={n: p.due_at for n, p in instance.deadlines.items()} if instance else {},
        )

    def _metadata(self, event: Message, saga_id: str) -> MessageMetadata:
        try:
            entry = registry.of(type(event))
            type_name, topic = entry.name, entry.topic or "fixture"
        except UnknownMessageType:
            type_name, topic = type(event).__qualname__, "fixture"
        return MessageMetadata(
            message_id=f"fixture-{self._seq}",
            message_type=type_name,
            correlation_id=saga_id,
            causation_id=None,
            occurred_at=self.now,
            topic=topic,
            partition=0,
            offset=self._seq,
            key=saga_id,
            headers={},
        )
