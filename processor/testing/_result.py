"""What one step of the saga fixture did, with chainable expectations (see ``SagaFixture``)."""

from __future__ import annotations

import difflib
import pprint
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Self

from processor._authoring.definition import SagaState
from processor._authoring.handles import CommandIntent, DeadlineOp, ScheduleDeadline
from processor._authoring.messages import Message

__all__ = ["Result", "diff"]


def diff(expected: object, actual: object) -> str:
    """A unified diff of two values as pprint shows them (in an expectation's failure)."""
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
        ignored: True when the event was ignored (saga ended or never started, or the message
            id was already applied).
        ended: Whether the saga has ended after the step.
        state: The saga's state after the step (None if it never started).
        pending: Deadlines pending after the step, name to due time.
        outcome: How the saga ended (a ``SagaOutcome`` name), once it has.
        waiting: Why the step's last handler handed the saga to a person
            (``SagaLifecycle.escalate``), if it did; the saga is ``WAITING`` until a handler
            runs again.
    """

    saga_id: str | None
    command_intents: list[CommandIntent]
    deadline_ops: list[tuple[DeadlineOp, datetime]]
    fired: list[str]
    ignored: bool
    ended: bool
    state: SagaState | None
    pending: dict[str, datetime]
    outcome: str | None = None
    waiting: str | None = None
    # Delivers the step's record again (for `redeliver`); None for steps that have no record.
    _again: Callable[[], Result] | None = field(default=None, repr=False, compare=False)

    def redeliver(self) -> Result:
        """Deliver the same record again (same message id), as Kafka does after a crash.

        The processor recognises the message id and records a duplicate: the result is
        ``ignored`` and sends nothing, whatever the handler would do.

        Raises:
            AssertionError: This step delivered no record (time passing, an operator request).
        """
        if self._again is None:
            raise AssertionError("only a step that delivered an event (`when`) can redeliver")
        return self._again()

    def expect_ignored(self) -> Self:
        """Assert the step changed nothing (a duplicate, an ended or never-started saga)."""
        if not self.ignored:
            raise AssertionError(f"the step was applied, not ignored: sent {self.commands}")
        return self

    @property
    def commands(self) -> list[Message]:
        """The sent commands' messages, in order."""
        return [intent.message for intent in self.command_intents]

    def expect_commands(self, *expected: Message) -> Self:
        """Assert exactly these commands were sent, in this order."""
        if list(expected) != self.commands:
            raise AssertionError("commands differ:\n" + diff(list(expected), self.commands))
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

    def expect_ended(self, outcome: str | None = None) -> Self:
        """Assert the saga has ended, and how when ``outcome`` (a ``SagaOutcome``) is given."""
        if not self.ended:
            raise AssertionError(f"expected the saga to have ended; it is active: {self.state!r}")
        if outcome is not None and self.outcome != outcome:
            raise AssertionError(f"expected the saga to end {outcome}; it ended {self.outcome}")
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
            raise AssertionError("state differs:\n" + diff(fields, actual))
        return self
