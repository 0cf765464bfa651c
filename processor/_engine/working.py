"""What the planner works on: routed items, each saga's state, the pass over the batch.

The pass is what every step reads and writes into. Also how a record is made storable as JSON.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from processor._engine.decode import (
    Event,
    FiredDeadline,
    Operator,
    TooNew,
)
from processor._engine.records import Record
from processor._engine.rows import (
    DeadlineInsert,
    Loaded,
    SagaRow,
    SagaStatus,
    WriteSet,
)
from processor._invocation import BoundSaga


# Not frozen: a frozen dataclass sets each field through object.__setattr__ (about 0.1 us a
# field), and one is built per event; nothing changes it once built.
@dataclass(slots=True)
class Item:
    """One unit of work for one saga: an event routed to it, or a deadline that fired."""

    decoded: Event | FiredDeadline | Operator | TooNew
    bound: BoundSaga
    saga_id: str
    # The id that marks this item applied: the message's, or one made from the deadline's.
    # Worked out once: routing, deduplication, commands and history all read it.
    message_id: str = field(init=False)

    def __post_init__(self) -> None:
        decoded = self.decoded
        if isinstance(decoded, FiredDeadline):
            self.message_id = f"deadline:{decoded.deadline_id}"
        elif isinstance(decoded, Operator):
            self.message_id = decoded.request.message_id
        else:
            self.message_id = decoded.metadata.message_id


@dataclass(slots=True)
class Working:
    """A saga's in-memory state while the batch runs over it."""

    bound: BoundSaga
    saga_id: str
    row: SagaRow | None
    state: Any  # SagaState | None
    status: SagaStatus | None
    version: int
    parked_reason: str | None = None
    # Why the stored state does not load; the row's JSON is then written back untouched.
    load_error: str | None = None
    dirty: bool = False
    # Net deadline changes: name -> new row, or None for "delete only".
    deadline_ops: dict[str, DeadlineInsert | None] = field(default_factory=dict)
    cleared: bool = False
    # How the saga ended, set by the handler that ended it; shown in the machine_state column.
    outcome: str | None = None
    # Why the last handler run handed the saga to a person (SagaLifecycle.escalate), if it did.
    waiting: str | None = None


MessageKey = tuple[str, str, str]
"""(saga type, saga id, message id): an input applied to a saga."""


@dataclass(slots=True)
class Pass:
    """One planning pass over a batch (or over a retry's trial replay): what each step reads.

    Attributes:
        ws: Where the pass's writes go.
        loaded: The rows the batch loaded.
        now: The clock reading handlers see.
        seen: Inputs applied (operator records: decided, whatever the outcome) before or
            during this pass: a later one is a duplicate.
        replay: The items are held records an operator replays (see ``Planner.plan``).
    """

    ws: WriteSet
    loaded: Loaded
    now: datetime
    seen: set[MessageKey]
    replay: bool


def storable(record: Record) -> Record:
    """``record`` with NUL characters in its header names and values replaced, for jsonb.

    The key and value are stored as bytes and kept exactly; only the headers, stored as JSON,
    are changed, and only when they hold a NUL.
    """
    if not any("\x00" in k or b"\x00" in v for k, v in record.headers):
        return record
    headers = tuple(
        (k.replace("\x00", "\ufffd"), v.replace(b"\x00", "\ufffd".encode()))
        for k, v in record.headers
    )
    return dataclasses.replace(record, headers=headers)
