"""An in-memory :class:`processor._ports.BatchStore` with the PostgreSQL store's rules."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from processor._engine.records import OffsetCommit, OutboxRow
from processor._engine.rows import (
    DECIDED,
    DeadLetter,
    HeldMessage,
    HistoryRow,
    Loaded,
    Outcome,
    ParkedMessage,
    PastInput,
    SagaKey,
    SagaRow,
    SagaStatus,
    Wants,
    WriteSet,
)
from processor._errors import ConcurrentUpdate, FencedOut, RecordDataError
from processor._memory.audit import MemoryAuditLog
from processor._memory.deadlines import DeadlineTable
from processor._ports import TP, DeadlineRow, Positions


@dataclass
class MemoryTables:
    """Everything the batch store keeps; tests read it directly."""

    offsets: dict[TP, tuple[int, int | None]] = field(default_factory=dict)
    sagas: dict[SagaKey, SagaRow] = field(default_factory=dict)
    history: list[HistoryRow] = field(default_factory=list)
    applied: set[tuple[str, str, str]] = field(default_factory=set)
    outbox: list[OutboxRow] = field(default_factory=list)
    deadlines: DeadlineTable = field(default_factory=DeadlineTable)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    parked: list[ParkedMessage] = field(default_factory=list)
    # The row id of each entry of ``parked`` (same positions), as the parked table's id column.
    parked_ids: list[int] = field(default_factory=list)
    next_parked_id: int = 1
    lease_token: int | None = None
    # Rows made due again by a consumer (deadline id, token); the memory store keeps no
    # dispatch state, so tests read them here.
    deadline_resets: list[tuple[str, int]] = field(default_factory=list)
    # An operator's fire-now requests, (saga type, saga id, name), for tests to inspect.
    deadline_fire_now: list[tuple[str, str, str]] = field(default_factory=list)
    # Ended sagas whose rows retention purged, with when they ended.
    tombstones: dict[SagaKey, datetime] = field(default_factory=dict)
    # The operator actions batches decided (skips, terminations, ...).
    audit: MemoryAuditLog = field(default_factory=MemoryAuditLog)

    def held_ids(self) -> list[int]:
        """``parked_ids``, first extended with ids for rows a test appended directly."""
        while len(self.parked_ids) < len(self.parked):
            self.parked_ids.append(self.next_parked_id)
            self.next_parked_id += 1
        return self.parked_ids


class MemoryBatchStore:
    """:class:`processor._ports.BatchStore` over :class:`MemoryTables`.

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
        # Ids compare as uuids, as in the uuid column; text that is no uuid is refused data.
        ids = {_uuid_text(i) for i in wants.deadline_ids}
        deadlines = {i: t.deadlines[i].ref for i in ids if i in t.deadlines}
        lease = t.lease_token if wants.deadline_ids else None
        tombstones = {k for k in wants.saga_keys if k in t.tombstones}
        held: dict[SagaKey, list[HeldMessage]] = {}
        for pid, p in zip(self.tables.held_ids(), t.parked, strict=True):
            key = (p.saga_type, p.saga_id)
            if key in wants.held_keys:
                held.setdefault(key, []).append(HeldMessage(pid, p.record))
        if wants.held_keys:
            lease = t.lease_token
        # The held fired deadlines of a replayed saga look up their rows; a reset replaces them.
        rebuilt = wants.held_keys | wants.history_keys
        if rebuilt:
            deadlines.update(
                (i, d.ref) for i, d in t.deadlines.items() if (d.saga_type, d.saga_id) in rebuilt
            )
        return Loaded(
            sagas,
            applied,
            deadlines,
            lease,
            self.clock(),
            tombstones=tombstones,
            held=held,
            decided=self._decided(wants),
            history=self._history(wants.history_keys),
        )

    def _decided(self, wants: Wants) -> set[tuple[str, str, str]]:
        """Of the batch's operator records, those decided before, whatever the outcome.

        Read off the history itself, as the PostgreSQL store does, so that retention's purges
        (`processor._memory.retention`) forget them alike.
        """
        if not wants.operator_keys:
            return set()
        return {
            key
            for h in self.tables.history
            if h.outcome in DECIDED
            and (key := (h.saga_type, h.saga_id, h.message_id)) in wants.operator_keys
        }

    def _history(self, keys: set[SagaKey]) -> dict[SagaKey, list[PastInput]]:
        """The applied and replayed inputs of the sagas a reset rebuilds, oldest first."""
        found: dict[SagaKey, list[PastInput]] = {}
        for h in self.tables.history if keys else ():
            key = (h.saga_type, h.saga_id)
            if key in keys and h.outcome in (Outcome.APPLIED, Outcome.REPLAYED):
                headers = dict(h.headers) if h.headers is not None else None
                where = (h.topic, h.partition, h.offset)
                row = (h.message_id, h.message_type, h.kind, str(h.outcome), h.version)
                past = PastInput(*row, *where, headers, h.payload, h.effects)
                found.setdefault(key, []).append(past)
        return found

    def purge_ended(self) -> int:
        """Purges every ended saga as retention would: its row and history go, a tombstone stays.

        The memory tables keep no end times, so the tombstone takes the store's clock; this is
        for tests, which decide themselves when a saga is old enough.
        """
        t = self.tables
        ended = [k for k, row in t.sagas.items() if row.status == SagaStatus.ENDED]
        gone = set(ended)
        for key in ended:
            del t.sagas[key]
            t.tombstones[key] = self.clock()
        t.history = [h for h in t.history if (h.saga_type, h.saga_id) not in gone]
        t.applied = {a for a in t.applied if (a[0], a[1]) not in gone}
        return len(ended)

    def write(
        self,
        ws: WriteSet,
        offsets: Sequence[OffsetCommit],
        *,
        before_commit: Callable[[], None] | None = None,
        dry_run: bool = False,
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
        # Then in the order of the PostgreSQL store's statements, so that a batch with several
        # faults is refused for the same one: new saga rows, updated ones, history, deadlines.
        new = [(s.saga_type, s.saga_id) for s in ws.sagas if s.expected_version is None]
        if len(set(new)) != len(new) or any(k in t.sagas for k in new):
            raise RecordDataError("23505", "duplicate saga instance")
        moved = [
            s
            for s in ws.sagas
            if s.expected_version is not None
            and (
                (row := t.sagas.get((s.saga_type, s.saga_id))) is None
                or row.version != s.expected_version
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
        self._check_deadlines(ws)
        if dry_run:
            return
        if before_commit is not None:
            before_commit()
        self._apply(ws, offsets)

    def _apply(self, ws: WriteSet, offsets: Sequence[OffsetCommit]) -> None:
        t = self.tables
        for s in ws.sagas:
            status = SagaStatus(s.status)
            t.sagas[(s.saga_type, s.saga_id)] = SagaRow(
                s.saga_type,
                s.saga_id,
                copy.deepcopy(s.state),
                status,
                s.version,
                s.parked_reason,
                s.state_version,
            )
        t.history.extend(ws.history)
        t.applied.update(
            (h.saga_type, h.saga_id, h.message_id)
            for h in ws.history
            if h.outcome is Outcome.APPLIED
        )
        t.outbox.extend(ws.outbox)
        for did in self._removed_deadlines(ws):
            del t.deadlines[did]
        for d in ws.deadline_inserts:
            payload: Any = copy.deepcopy(d.payload)
            did = _uuid_text(d.id)
            t.deadlines.put(
                DeadlineRow(
                    did, d.saga_type, d.saga_id, d.name, d.due_at, payload, d.topic, d.partition
                )
            )
        t.deadline_resets.extend(ws.deadline_resets)
        t.deadline_fire_now.extend(ws.deadline_fire_now)
        t.dead_letters.extend(ws.dead_letters)
        if ws.held_releases:
            gone = set(ws.held_releases)
            kept = [
                (i, p)
                for i, p in zip(self.tables.held_ids(), t.parked, strict=True)
                if i not in gone
            ]
            t.parked_ids = [i for i, _ in kept]
            t.parked = [p for _, p in kept]
        self.tables.held_ids()
        t.parked.extend(ws.parked)
        self.tables.held_ids()
        if ws.audit:
            t.audit.record(ws.audit, self.clock())
        for o in offsets:
            t.offsets[(o.topic, o.partition)] = (o.epoch, o.next_offset)

    def _removed_deadlines(self, ws: WriteSet) -> list[str]:
        """Ids of the stored deadlines that the batch's clears and deletes remove."""
        return self.tables.deadlines.removed_by(ws.deadline_clears, ws.deadline_deletes)

    def _check_deadlines(self, ws: WriteSet) -> None:
        # The table's keys: the id, and the name per saga instance. Clears and deletes run
        # before the inserts, so a batch may reschedule a name it deletes.
        removed = set(self._removed_deadlines(ws))
        kept = {did: row for did, row in self.tables.deadlines.items() if did not in removed}
        ids = [_uuid_text(d.id) for d in ws.deadline_inserts]
        names = [(d.saga_type, d.saga_id, d.name) for d in ws.deadline_inserts]
        taken = {(r.saga_type, r.saga_id, r.name) for r in kept.values()}
        if len(set(ids)) != len(ids) or any(i in kept for i in ids):
            raise RecordDataError("23505", "duplicate deadline id")
        if len(set(names)) != len(names) or taken.intersection(names):
            raise RecordDataError("23505", "duplicate deadline name")

    def close(self) -> None:
        """Nothing to release."""


def _uuid_text(value: str) -> str:
    """A uuid's canonical text, as PostgreSQL prints it; refused data when it is no uuid."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise RecordDataError("22P02", "invalid input syntax for type uuid") from None
