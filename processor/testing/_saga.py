"""In-memory saga test fixture with virtual time: no Kafka, no PostgreSQL, no sleeping.

Example:
    >>> fixture = SagaFixture(TransferSaga)  # doctest: +SKIP
    >>> fixture.given(TransferRequested(...))  # doctest: +SKIP
    >>> fixture.when_time_elapses(timedelta(minutes=30)).expect_commands(
    ...     ReverseDebit(...)
    ... ).expect_ended().expect_no_deadlines()  # doctest: +SKIP

The fixture has no saga rules of its own: each event becomes the record a producer would send,
each due deadline the fired record the poller would send, and the engine's planner plans them
over the in-memory store as the consumer would (see :mod:`processor.testing._engine`). So
scheduling a name replaces it, cancelling an absent name does nothing, a fired deadline is
consumed before its handler's own operations apply, ending removes every deadline, and events
for an ended saga, for a saga that never started, or already applied, are recorded and ignored,
exactly as in production.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Self

from processor._authoring.definition import SagaState, definition_of
from processor._authoring.messages import Message, MessageMetadata, registry
from processor._engine.decode import Event, FiredDeadline, Operator, TooNew
from processor._engine.rows import ACTIVE, ENDED, HistoryRow, Outcome, SagaRow
from processor._invocation import bind
from processor._wire import (
    OperatorAction,
    OperatorRecord,
)
from processor.testing._engine import (
    Engine,
    HandlerRun,
    dispatch,
    due_deadlines,
    event_record,
    operator_record,
)
from processor.testing._result import Result

__all__ = ["DEFAULT_START_TIME", "Result", "SagaFixture"]

DEFAULT_START_TIME = datetime(2026, 1, 1, tzinfo=UTC)


# What the planner records for an input it does not run a handler for.
_IGNORED = frozenset({Outcome.IGNORED_ENDED, Outcome.NO_SAGA, Outcome.DUPLICATE})
_REFUSED = frozenset({Outcome.IGNORED_ENDED, Outcome.NO_SAGA, Outcome.OPERATOR_REFUSED})


def _replayed_runs(history: list[HistoryRow]) -> int:
    """How many handler runs a reset's replay made: one per replayed row that ran a handler."""
    ran = ("event", "deadline")
    asked = (f"operator:{OperatorAction.CANCEL}", f"operator:{OperatorAction.RESOLVE}")
    return sum(
        1
        for h in history
        if h.outcome is Outcome.REPLAYED and (h.kind in ran or h.message_type in asked)
    )


class SagaFixture:
    """Drives one saga class in memory with a virtual clock.

    Attributes:
        now: The virtual clock.
        ignored: Events ignored because their saga had ended or never started, or because
            their message id was already applied.
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
        self._engine = Engine(self.bound, registry, lambda: self.now)
        self._seq = 0

    @property
    def state(self) -> SagaState | None:
        """State of the fixture's saga instance, or None before it starts."""
        return self._state_of(self.saga_id)

    @property
    def ended(self) -> bool:
        """Whether the fixture's saga instance has ended."""
        row = self._row(self.saga_id)
        return row is not None and row.status == ENDED

    @property
    def pending_deadlines(self) -> dict[str, datetime]:
        """Deadlines pending on the fixture's saga instance, name to due time."""
        return self._pending_of(self.saga_id)

    def given_stored_state(
        self, state: Mapping[str, Any], *, version: int, saga_id: str | None = None
    ) -> Self:
        """Start from a state stored by older code, as JSON at state ``version``.

        The next event or deadline loads it exactly as the processor would: through the saga
        type's upcasters, then the state model. Use it to test an upcaster::

            fixture.given_stored_state({"amount": "5"}, version=1, saga_id="t-1")
            fixture.when(DebitConfirmed(transfer_id="t-1")).expect_state(amount_minor=500)

        Args:
            state: The stored JSON.
            version: The state version it was written at.
            saga_id: The instance; defaults to the fixture's saga id.

        Raises:
            ValueError: No saga id was given to the fixture or here.
        """
        saga_id = saga_id or self.saga_id
        if saga_id is None:
            raise ValueError("give the saga id: given_stored_state(..., saga_id='...')")
        if self.saga_id is None:
            self.saga_id = saga_id
        key = (self.bound.saga_type, saga_id)
        self._engine.store.tables.sagas[key] = SagaRow(
            key[0], saga_id, dict(state), ACTIVE, 1, None, version
        )
        return self

    def given(self, *events: Message) -> Self:
        """Apply ``events`` in order as history; returns the fixture for chaining."""
        for event in events:
            self.when(event)
        return self

    def when(
        self,
        event: Message,
        *,
        message_id: str | None = None,
        metadata: MessageMetadata | None = None,
    ) -> Result:
        """Deliver ``event`` at the current virtual time.

        A reply published twice upstream is two records with one message id: deliver it twice
        with the same ``message_id``, and the second is a duplicate (``ignored``). For the
        same record delivered again, use :meth:`Result.redeliver`.

        Args:
            event: The event; its association value picks the saga instance.
            message_id: The message id of the made-up metadata (unique per step by default).
            metadata: Metadata to inject; a plausible one is made up when omitted. Delivering
                a message id that was already applied is a duplicate, and ignored.

        Raises:
            HandlerError: The handler raised; the saga is left as it was.
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
        meta = metadata or self._metadata(event, saga_id, message_id)
        record = event_record(event, meta, registry, self._seq)
        # Injected metadata reaches the handler as given; made-up metadata goes over the wire
        # format, so an event that would not survive it fails here rather than in production.
        decoded = (
            Event(record, event, meta) if metadata is not None else self._engine.decode(record)
        )
        return self._deliver(event, saga_id, decoded)

    def _deliver(
        self, event: Message, saga_id: str, decoded: Event | FiredDeadline | TooNew | Operator
    ) -> Result:
        batch = self._engine.run([decoded], self.now)
        ignored = any(outcome in _IGNORED for outcome in batch.outcomes())
        if ignored:
            self.ignored.append(event)
        result = self._result(saga_id, batch.runs, ignored=ignored)
        result._again = lambda: self._deliver(event, saga_id, decoded)
        return result

    def when_cancelled(self, reason: str = "cancelled in a test") -> Result:
        """An operator's ``saga cancel``: runs the saga's cancel path, as the processor does.

        Raises:
            AssertionError: The processor would refuse it (no saga yet, or it has ended).
            HandlerError: The cancel path raised.
        """
        return self._operator(OperatorAction.CANCEL, reason, None)

    def when_terminated(self, reason: str = "terminated in a test") -> Result:
        """An operator's ``saga terminate --force``: ends the saga, compensating nothing.

        Raises:
            AssertionError: The processor would refuse it (no saga yet, or it has ended).
        """
        return self._operator(OperatorAction.TERMINATE, reason, None)

    def when_resolved(self, decision: str, reason: str = "decided in a test") -> Result:
        """An operator's ``saga resolve``: a decision for a step escalated to a person.

        Args:
            decision: ``"retry"``, ``"skip"`` or ``"compensate"``; for an undo escalated after
                its retries, ``"retry"`` (send it again) or ``"skip"`` (undone by hand; the
                earlier undos follow), ``"compensate"`` being refused.
            reason: Why, as recorded in the history.

        Raises:
            AssertionError: The processor would refuse it (nothing waits for a decision).
            HandlerError: The saga's resolve path raised.
        """
        return self._operator(OperatorAction.RESOLVE, reason, decision)

    def when_injected(self, event: Message, reason: str = "injected in a test") -> Result:
        """An operator's ``saga inject``: ``event`` applied through the operator record.

        Raises:
            AssertionError: The processor would refuse it (its association value names another
                saga, no saga yet, or it has ended).
            HandlerError: The event's handler raised.
        """
        name = registry.of(type(event)).name
        return self._operator(OperatorAction.INJECT, reason, name, event.model_dump_json())

    def when_reset(
        self, before: Message | str, *, resend: bool = False, reason: str = "reset in a test"
    ) -> Result:
        """An operator's ``saga reset``: the saga rebuilt before ``before``, the rest replayed.

        Run it after changing a handler (a fixed bug): the inputs before ``before`` rebuild the
        state quietly, and it and the later ones replay with the code as it is now.

        Args:
            before: The input to go back before: an event delivered earlier (the latest one
                equal to it), or its message id.
            resend: Let the replay send again commands of kinds those inputs already sent.
            reason: Why, as recorded in the history.

        Raises:
            AssertionError: The processor would refuse it (the replay would send a command again
                without ``resend``, a replayed input fails, no such input).
        """
        if isinstance(before, str):
            message_id = before
        else:
            value = before.model_dump_json().encode()
            key = (self.bound.saga_type, self.saga_id)
            found = [
                h.message_id
                for h in self._engine.store.tables.history
                if (h.saga_type, h.saga_id) == key and h.kind == "event" and h.payload == value
            ]
            if not found:
                raise AssertionError(f"the saga applied no {type(before).__name__} like that")
            message_id = found[-1]
        options = '{"resend": true}' if resend else '{"resend": false}'
        return self._operator(OperatorAction.RESET, reason, message_id, options)

    def _operator(
        self, action: OperatorAction, reason: str, name: str | None, message: str | None = None
    ) -> Result:
        if self.saga_id is None:
            raise AssertionError(f"no saga to {action}: deliver its start event first")
        self._seq += 1
        request = OperatorRecord(
            action=action,
            saga_type=self.definition.saga_type,
            saga_id=self.saga_id,
            command_id=f"fixture-{self._seq}",
            by="saga-fixture",
            reason=reason,
            name=name,
            # Issued on the virtual clock the batch runs at: never expired.
            issued_at=int(self.now.timestamp() * 1000),
            message=message,
        )
        decoded = self._engine.decode(operator_record(request, self._seq))
        batch = self._engine.run([decoded], self.now)
        refused = [h for h in batch.ws.history if h.outcome in _REFUSED]
        if refused:
            raise AssertionError(
                f"the processor would refuse the {action}: {refused[0].outcome} "
                f"({refused[0].detail})"
            )
        runs = batch.runs
        if action == OperatorAction.RESET:
            # The rebuild's handler runs come first and sent nothing: the result is the replay's.
            runs = runs[len(runs) - _replayed_runs(batch.ws.history) :]
            if self._row(self.saga_id) is not None and not self._result(self.saga_id, []).ended:
                self._engine.outcomes.pop((self.bound.saga_type, self.saga_id), None)
        return self._result(self.saga_id, runs)

    def when_time_elapses(self, delta: timedelta) -> Result:
        """Advance the virtual clock by ``delta``, firing every deadline that comes due.

        Deadlines fire in due order (ties in scheduling order), each with the clock set to its
        due time, so deadlines their handlers schedule are measured from that moment and fire
        within the same step if they come due before the end of it.

        Raises:
            HandlerError: A deadline's handler raised; the clock stays at its due time.
        """
        if delta < timedelta(0):
            raise ValueError("time only moves forward")
        target = self.now + delta
        runs: list[HandlerRun] = []
        tables = self._engine.store.tables
        while due := due_deadlines(tables, target):
            deadline = due[0]
            self.now = max(self.now, deadline.due_at)
            self._seq += 1
            record = dispatch(tables, deadline, self._seq)
            runs.extend(self._engine.run([self._engine.decode(record)], self.now).runs)
            if deadline.id in tables.deadlines:
                raise AssertionError(f"deadline {deadline.name!r} fired but was not consumed")
        self.now = target
        return self._result(self.saga_id, runs)

    def _row(self, saga_id: str | None) -> SagaRow | None:
        return self._engine.store.tables.sagas.get((self.bound.saga_type, saga_id or ""))

    def _state_of(self, saga_id: str | None) -> SagaState | None:
        # The stored JSON, as the next batch will load it: a state that does not survive the
        # round trip shows up here, not in production.
        row = self._row(saga_id)
        if row is None or row.state is None:
            return None
        return self.bound.state_from_json(row.state, row.state_version)

    def _pending_of(self, saga_id: str | None) -> dict[str, datetime]:
        return {
            d.name: d.due_at
            for d in self._engine.store.tables.deadlines.values()
            if d.saga_type == self.bound.saga_type and d.saga_id == saga_id
        }

    def _result(
        self, saga_id: str | None, runs: list[HandlerRun], *, ignored: bool = False
    ) -> Result:
        row = self._row(saga_id)
        return Result(
            saga_id=saga_id,
            command_intents=[c for run in runs for c in run.outcome.commands],
            deadline_ops=[(op, run.at) for run in runs for op in run.outcome.deadlines],
            fired=[run.deadline for run in runs if run.deadline is not None],
            ignored=ignored,
            ended=row is not None and row.status == ENDED,
            state=self._state_of(saga_id),
            pending=self._pending_of(saga_id),
            outcome=self._engine.outcomes.get((self.bound.saga_type, saga_id or "")),
            waiting=runs[-1].outcome.escalated if runs else None,
        )

    def _metadata(self, event: Message, saga_id: str, message_id: str | None) -> MessageMetadata:
        entry = registry.of(type(event))
        return MessageMetadata(
            message_id=message_id or f"fixture-{self._seq}",
            message_type=entry.name,
            correlation_id=saga_id,
            causation_id=None,
            occurred_at=self.now,
            topic=entry.topic or "fixture",
            partition=0,
            offset=self._seq,
            key=saga_id,
            headers={},
        )
