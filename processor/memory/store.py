"""An in-memory :class:`processor.ports.BatchStore` with the PostgreSQL store's rules."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from processor.engine.records import OffsetCommit, OutboxRow
from processor.engine.rows import (
    DeadLetter,
    DeadlineRef,
    HistoryRow,
    Loaded,
    Outcome,
    ParkedMessage,
    SagaKey,
    SagaRow,
    SagaStatus,
    Wants,
    WriteSet,
)
from processor.errors import ConcurrentUpdate, FencedOut, RecordDataError
from processor.ports import TP, Positions


@dataclass
class StoredDeadline:
    """A row of the deadline table."""

    ref: DeadlineRef
    id: str
    topic: str
    partition: int


@dataclass
class MemoryTables:
    """Everything the batch store keeps; tests read it directly."""

    offsets: dict[TP, tuple[int, int | None]] = field(default_factory=dict)
    sagas: dict[SagaKey, SagaRow] = field(default_factory=dict)
    history: list[HistoryRow] = field(default_factory=list)
    applied: set[tuple[str, str, str]] = field(default_factory=set)
    outbox: list[OutboxRow] = field(default_factory=list)
    deadlines: dict[str, StoredDeadline] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    parked: list[ParkedMessage] = field(default_factory=list)
    lease_token: int | None = None
    # Rows made due again by a consumer (deadline id, token); the memory store keeps no
    # dispatch state, so tests read them here.
    deadline_resets: list[tuple[str, int]] = field(default_factory=list)


class MemoryBatchStore:
    """:class:`processor.ports.BatchStore` over :class:`MemoryTables`.

    A write checks every compare-and-set before it changes anything, so a refused batch leaves
    no trace, as a rolled-back transaction would.
    """

    def __init__(
        self,
        tables: MemoryTables | None = None,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.tables = tables if tables is not None else MemoryTables()
        self.clock = clock

    def claim(self, partitions: Sequence[TP], owner: str) -> Positions:
        out: Positions = {}
        for tp in partitions:
            epoch, nxt = self.tables.offsets.get(tp, (0, None))
            self.tables.offsets[tp] = out[tp] = (epoch + 1, nxt)
        return out

    def read_offsets(self, partitions: Sequence[TP]) -> Positions:
        return {tp: self.tables.offsets[tp] for tp in partitions if tp in self.tables.offsets}

    def load(self, wants: Wants) -> Loaded:
        t = self.tables
        sagas = {k: copy.deepcopy(t.sagas[k]) for k in wants.saga_keys if k in t.sagas}
        applied = {k for k in wants.message_keys if k in t.applied}
        deadlines = {i: t.deadlines[i].ref for i in wants.deadline_ids if i in t.deadlines}
        lease = t.lease_token if wants.deadline_ids else None
        return Loaded(sagas, applied, deadlines, lease, self.clock())

    def write(
        self,
        ws: WriteSet,
        offsets: Sequence[OffsetCommit],
        *,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        t = self.tables
        # Fencing first, as the PostgreSQL store does: a stale batch is refused for what it is.
        lost = [
            (o.topic, o.partition)
            for o in offsets
            if t.offsets.get((o.topic, o.partition), (None, None)) != (o.epoch, o.expected)
        ]
        if lost:
            raise FencedOut(lost)
        moved = [
            s
            for s in ws.sagas
            if (
                (s.saga_type, s.saga_id) in t.sagas
                if s.expected_version is None
                else t.sagas.get((s.saga_type, s.saga_id)) is None
                or t.sagas[(s.saga_type, s.saga_id)].version != s.expected_version
            )
        ]
        if moved:
            raise ConcurrentUpdate(f"{len(moved)} saga rows changed under the batch")
        applied = [
            (h.saga_type, h.saga_id, h.message_id)
            for h in ws.history
            if h.outcome is Outcome.APPLIED
        ]
        if len(set(applied)) != len(applied) or t.applied.intersection(applied):
            raise RecordDataError("23505", "duplicate applied message id")
        names = {(d.saga_type, d.saga_id, d.name) for d in ws.deadline_inserts}
        if len(names) != len(ws.deadline_inserts):
            raise RecordDataError("23505", "duplicate deadline name")
        if before_commit is not None:
            before_commit()
        self._apply(ws, offsets)

    def _apply(self, ws: WriteSet, offsets: Sequence[OffsetCommit]) -> None:
        t = self.tables
        for s in ws.sagas:
            status = SagaStatus(s.status)
            t.sagas[(s.saga_type, s.saga_id)] = SagaRow(
                s.saga_type, s.saga_id, copy.deepcopy(s.state), status, s.version, s.parked_reason
            )
        t.history.extend(ws.history)
        t.applied.update(
            (h.saga_type, h.saga_id, h.message_id)
            for h in ws.history
            if h.outcome is Outcome.APPLIED
        )
        t.outbox.extend(ws.outbox)
        cleared = set(ws.deadline_clears)
        deleted = set(ws.deadline_deletes)
        for did, row in list(t.deadlines.items()):
            ref = row.ref
            if (ref.saga_type, ref.saga_id) in cleared or (
                ref.saga_type,
                ref.saga_id,
                ref.name,
            ) in deleted:
                del t.deadlines[did]
        for d in ws.deadline_inserts:
            payload: Any = copy.deepcopy(d.payload)
            ref = DeadlineRef(d.saga_type, d.saga_id, d.name, d.due_at, payload, None)
            did = str(uuid.UUID(d.id))
            t.deadlines[did] = StoredDeadline(ref, did, d.topic, d.partition)
        t.deadline_resets.extend(ws.deadline_resets)
        t.dead_letters.extend(ws.dead_letters)
        t.parked.extend(ws.parked)
        for o in offsets:
            t.offsets[(o.topic, o.partition)] = (o.epoch, o.next_offset)

    def close(self) -> None:
        """Nothing to release."""
