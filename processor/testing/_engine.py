"""The engine path under the saga fixture: records in, the planner, the in-memory store.

:class:`processor.testing.SagaFixture` owns no saga rules of its own. It turns each event into the
record a producer would send, and each due deadline into the fired record the poller would send,
then prepares, plans and writes them by the consumer's own recipe (``Planner.prepare``, the
store's load, ``Planner.apply``, over :class:`~processor._memory.store.MemoryBatchStore`). What
the store cannot tell, the handler runs themselves (commands with their headers, deadline
operations in call order), is observed on the way through the planner.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from processor._authoring.definition import SagaState
from processor._authoring.messages import Message, MessageMetadata, MessageRegistry
from processor._engine.decode import Event, FiredDeadline, Operator, Rejected, TooNew, decode
from processor._engine.plan import Planner
from processor._engine.records import Record
from processor._engine.rows import ENDED, WriteSet
from processor._engine.rows import Outcome as RowOutcome
from processor._errors import HandlerError
from processor._invocation import BoundSaga, DeadlineInput, EventInput, OperatorRequest, Outcome
from processor._memory.store import MemoryBatchStore, MemoryTables
from processor._ports import DeadlineRow as StoredDeadline
from processor._wire import OperatorRecord, envelope

__all__ = [
    "FIXTURE_LEASE_TOKEN",
    "Batch",
    "Engine",
    "HandlerRun",
    "ObservedSaga",
    "dispatch",
    "due_deadlines",
    "event_record",
    "sequential_ids",
]

# The fixture plays the only deadline poller there is, so its lease never changes hands.
FIXTURE_LEASE_TOKEN = 1
# Records are built in memory; nothing is too large for the fixture.
_MAX_RECORD_BYTES = 1 << 40
_DEAD_LETTER_TOPIC = "fixture.dead-letters"


@dataclass(frozen=True, slots=True)
class HandlerRun:
    """One handler invocation the planner made: what it decided, when, and for which deadline."""

    saga_id: str
    outcome: Outcome
    at: datetime
    deadline: str | None


class ObservedSaga(BoundSaga):
    """The bound saga as the planner sees it, recording each run for the fixture's results.

    A handler failure is recorded too, so the fixture can raise it instead of the planner
    parking the saga (a test wants the error, not a parked row).
    """

    def __init__(self, inner: BoundSaga) -> None:
        # Shares the inner saga's resolved settings and dependencies as they are.
        vars(self).update(vars(inner))
        self.runs: list[HandlerRun] = []
        self.failure: HandlerError | None = None

    def handle_event(
        self, state: SagaState | None, saga_id: str, inp: EventInput, now: datetime
    ) -> Outcome:
        """Run the event's handler, recording the outcome or the failure."""
        return self._observed(
            saga_id,
            now,
            None,
            lambda: super(ObservedSaga, self).handle_event(state, saga_id, inp, now),
        )

    def handle_deadline(
        self, state: SagaState, saga_id: str, inp: DeadlineInput, now: datetime
    ) -> Outcome:
        """Run the deadline's handler, recording the outcome or the failure."""
        return self._observed(
            saga_id,
            now,
            inp.name,
            lambda: super(ObservedSaga, self).handle_deadline(state, saga_id, inp, now),
        )

    def handle_request(
        self,
        state: SagaState,
        saga_id: str,
        label: str,
        request: OperatorRequest,
        now: datetime,
    ) -> Outcome:
        """Run an operator's cancel or decision, recording the outcome or the failure."""
        return self._observed(
            saga_id,
            now,
            None,
            lambda: super(ObservedSaga, self).handle_request(state, saga_id, label, request, now),
        )

    def _observed(
        self, saga_id: str, now: datetime, deadline: str | None, run: Callable[[], Outcome]
    ) -> Outcome:
        try:
            outcome = run()
        except HandlerError as e:
            self.failure = e
            raise
        self.runs.append(HandlerRun(saga_id, outcome, now, deadline))
        return outcome


def sequential_ids() -> Callable[[], str]:
    """Deadline ids (valid uuids) that grow in scheduling order, for the planner's ``deadline_ids``.

    Ordering due deadlines by ``(due_at, id)`` then fires ties in the order they were scheduled.
    """
    counter = itertools.count(1)
    return lambda: f"{next(counter):032x}"


def event_record(
    event: Message, metadata: MessageMetadata, registry: MessageRegistry, offset: int
) -> Record:
    """The record a producer of ``event`` would send, with the processor's wire headers."""
    entry = registry.of(type(event))
    headers = envelope(
        message_id=metadata.message_id,
        message_type=entry.name,
        schema_version=entry.version,
        correlation_id=metadata.correlation_id,
        causation_id=metadata.causation_id,
        occurred_at=metadata.occurred_at,
        extra=metadata.headers,
    )
    return Record(
        topic=metadata.topic,
        partition=metadata.partition,
        offset=offset,
        key=metadata.key.encode() if metadata.key is not None else None,
        value=event.model_dump_json().encode(),
        headers=tuple((k, v.encode()) for k, v in headers.items()),
        # The broker's timestamp too is the fixture's virtual time, never the wall clock's.
        timestamp_ms=(
            int(metadata.occurred_at.timestamp() * 1000) if metadata.occurred_at else None
        ),
    )


FIXTURE_OPERATOR_KEY = b"saga-fixture-operator-key"
"""The fixture's operator requests are signed like production's, under this key."""


def operator_record(request: OperatorRecord, offset: int) -> Record:
    """The record ``saga-processor saga ...`` would send for ``request``."""
    value = request.value()
    return Record(
        topic="saga-fixture-operator",
        partition=0,
        offset=offset,
        key=request.saga_id.encode(),
        value=value,
        headers=tuple((k, v.encode()) for k, v in request.headers(FIXTURE_OPERATOR_KEY).items()),
    )


def due_deadlines(tables: MemoryTables, until: datetime) -> list[StoredDeadline]:
    """Stored deadlines due by ``until``, in due order (ties by id)."""
    due = [d for d in tables.deadlines.values() if d.due_at <= until]
    return sorted(due, key=lambda d: (d.due_at, d.id))


def dispatch(tables: MemoryTables, deadline: StoredDeadline, offset: int) -> Record:
    """Claims ``deadline`` under the lease, as the poller does, and returns its fired record."""
    token = tables.lease_token
    if token is None:
        raise ValueError("no poller lease: set tables.lease_token first")
    deadline.dispatch_token = token
    fired = deadline.fired(token)
    return Record(
        topic=deadline.topic,
        partition=deadline.partition,
        offset=offset,
        key=fired.key(),
        value=fired.value(),
        headers=tuple((k, v.encode()) for k, v in fired.headers().items()),
    )


class Engine:
    """One saga type on the planner and the in-memory store, one batch per call.

    Attributes:
        saga: The observed bound saga the planner runs.
        store: The in-memory store; its tables are the fixture's whole state.
    """

    def __init__(self, bound: BoundSaga, registry: MessageRegistry, clock: Callable[[], datetime]):
        self.saga = ObservedSaga(bound)
        self.registry = registry
        # One attempt: the fixture reports a handler's failure rather than retrying it.
        self._planner = Planner(
            {bound.saga_type: self.saga},
            registry=registry,
            dead_letter_topic=_DEAD_LETTER_TOPIC,
            handler_attempts=1,
            deadline_ids=sequential_ids(),
            operator_key=FIXTURE_OPERATOR_KEY,
        )
        self.store = MemoryBatchStore(clock=clock)
        # How each ended saga ended (the `machine_state` column the store does not keep).
        self.outcomes: dict[tuple[str, str], str | None] = {}
        self.store.tables.lease_token = FIXTURE_LEASE_TOKEN

    def decode(self, record: Record) -> Event | FiredDeadline | TooNew | Operator:
        """Decodes a record the fixture built; a rejection means the fixture's input is bad."""
        decoded = decode(record, self.registry, _MAX_RECORD_BYTES)
        if isinstance(decoded, Rejected):
            raise AssertionError(f"the processor would dead-letter this input: {decoded.detail}")
        return decoded

    def run(
        self, inputs: Sequence[Event | FiredDeadline | TooNew | Operator], now: datetime
    ) -> Batch:
        """Plans ``inputs`` as one batch at ``now`` and writes it.

        Raises:
            HandlerError: A handler raised; nothing of the batch is written.
        """
        runs_before = len(self.saga.runs)
        self.saga.failure = None
        prepared = self._planner.prepare(inputs)
        ws = self._planner.apply(prepared, self.store.load(prepared.wants), now=now)
        if self.saga.failure is not None:
            failure, self.saga.failure = self.saga.failure, None
            del self.saga.runs[runs_before:]
            raise failure
        parked = [h for h in ws.history if h.outcome is RowOutcome.PARKED]
        if parked:
            # Not a handler's failure (those raise above): the stored state does not load, a
            # message is newer than the code, a command cannot be encoded. A test wants the
            # reason, not a parked row.
            raise AssertionError(f"the processor would park the saga: {parked[0].detail}")
        self.store.write(ws, [])
        for s in ws.sagas:
            if s.status == ENDED:
                self.outcomes[(s.saga_type, s.saga_id)] = s.machine_state
        return Batch(ws, self.saga.runs[runs_before:])


@dataclass(frozen=True, slots=True)
class Batch:
    """What one written batch did."""

    ws: WriteSet
    runs: list[HandlerRun]

    def outcomes(self) -> list[RowOutcome]:
        """The history outcome of each input, in order."""
        return [h.outcome for h in self.ws.history]
