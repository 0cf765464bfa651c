"""The consumer worker over in-memory adapters: commits, pipelining, fencing, retries, doubt.

The real planner runs the example transfer saga; the store and the consumer are the in-memory
adapters, so every case is deterministic and needs no sleeping: ``settle()`` waits for the
writer thread, and hooks hold a batch at a named point until the test releases it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from processor._authoring.messages import Message
from processor._engine.records import OffsetCommit, Record
from processor._engine.rows import Outcome, WriteSet
from processor._errors import CommitInDoubt, Retryable, RuntimeFailure
from processor._memory.consumer import MemoryRecordConsumer
from processor._memory.store import MemoryBatchStore, MemoryTables
from processor._ports import TP
from processor._runtime.assembly import bind_sagas
from processor._runtime.consumer.ownership import Ownership
from processor._runtime.consumer.worker import Worker
from processor._runtime.hooks import Hooks
from processor._wire import (
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_SCHEMA_VERSION,
    FiredRecord,
)
from processor.settings import ProcessorSettings
from sagas.transfer import PAYMENT_TIMEOUT, TransferSaga
from schemas.transfers import (
    ACCOUNT_COMMANDS_TOPIC,
    TRANSFER_EVENTS_TOPIC,
    DebitConfirmed,
    TransferRequested,
)

SAGA = "transfer-saga"
P0: TP = (TRANSFER_EVENTS_TOPIC, 0)
P1: TP = (TRANSFER_EVENTS_TOPIC, 1)
# Generous: only reached when the worker is broken and a hook would otherwise wait forever.
WAIT = 10.0


class FaultyStore(MemoryBatchStore):
    """A memory store whose next writes fail before or after they are applied.

    ``fail_before`` failures are raised instead of writing; ``fail_after`` failures are raised
    once the write has been applied, as a connection lost during COMMIT would leave it.
    """

    def __init__(self, tables: MemoryTables) -> None:
        super().__init__(tables)
        self.fail_before: list[RuntimeFailure] = []
        self.fail_after: list[RuntimeFailure] = []
        self.writes = 0

    def write(
        self,
        ws: WriteSet,
        offsets: Sequence[OffsetCommit],
        *,
        before_commit: Callable[[], None] | None = None,
        dry_run: bool = False,
    ) -> None:
        self.writes += 1
        if self.fail_before:
            raise self.fail_before.pop(0)
        super().write(ws, offsets, before_commit=before_commit, dry_run=dry_run)
        if self.fail_after:
            raise self.fail_after.pop(0)


@dataclass
class Rig:
    """One worker over one set of memory tables, with its consumer and hooks."""

    tables: MemoryTables
    store: FaultyStore
    consumer: MemoryRecordConsumer
    hooks: Hooks
    worker: Worker
    committed: list[WriteSet]

    def send(self, tp: TP, message: Message, message_id: str) -> Record:
        """Appends an event to a partition with the headers a producer would set."""
        mt = self.worker.registry.of(type(message))
        headers = [
            (HEADER_MESSAGE_ID, message_id.encode()),
            (HEADER_MESSAGE_TYPE, mt.name.encode()),
            (HEADER_SCHEMA_VERSION, str(mt.version).encode()),
        ]
        key = str(getattr(message, "transfer_id", "")).encode()
        return self.consumer.append(
            tp[0], tp[1], message.model_dump_json().encode(), key=key, headers=headers
        )

    def step(self) -> int:
        """One poll and then waits for its batch to finish on the writer thread."""
        n = self.worker.poll_once()
        self.worker.settle()
        return n

    def applied(self, saga_id: str) -> list[str]:
        """Message ids applied to a transfer saga, in commit order."""
        return [
            h.message_id
            for h in self.tables.history
            if h.saga_id == saga_id and h.outcome is Outcome.APPLIED
        ]

    def commands(self) -> list[tuple[str, str]]:
        """(message type, transfer id) of each command in the outbox, in order."""
        out = []
        for row in self.tables.outbox:
            assert row.topic == ACCOUNT_COMMANDS_TOPIC
            out.append((row.headers[HEADER_MESSAGE_TYPE], row.saga_id or ""))
        return out


@contextmanager
def rigged(**given: Any) -> Iterator[Rig]:
    """A rig whose worker is also given ``given`` (callbacks, the gate, what it follows)."""
    bound = bind_sagas(ProcessorSettings(database={"url": "postgresql://unused"}), [TransferSaga])
    tables = MemoryTables()
    store = FaultyStore(tables)
    hooks = Hooks()
    committed: list[WriteSet] = []
    worker = Worker(
        store=store,
        # A second handle on the same tables, as production has a second connection.
        control=MemoryBatchStore(tables),
        planner=bound.planner,
        registry=bound.registry,
        owner="me",
        consumer=MemoryRecordConsumer,
        max_record_bytes=1 << 20,
        batch_size=100,
        batch_timeout=0.0,
        on_commit=committed.append,
        hooks=hooks,
        **given,
    )
    consumer = worker.consumer
    assert isinstance(consumer, MemoryRecordConsumer)
    try:
        yield Rig(tables, store, consumer, hooks, worker, committed)
    finally:
        worker.close()


@pytest.fixture
def rig() -> Iterator[Rig]:
    with rigged() as r:
        yield r


def requested(tid: str) -> TransferRequested:
    return TransferRequested(
        transfer_id=tid, source_account_id="A", target_account_id="B", amount=Decimal("5.00")
    )


def debited(tid: str) -> DebitConfirmed:
    return DebitConfirmed(transfer_id=tid, account_id="A", amount=Decimal("5.00"))


# Wire names of the commands the saga sends.
DEBIT = "transfers.DebitAccount"
CREDIT = "transfers.CreditAccount"


def test_a_batch_commits_its_effects_and_offsets(rig: Rig) -> None:
    rig.consumer.assign([P0])
    assert rig.tables.offsets[P0] == (1, None)
    rig.send(P0, requested("t1"), "m1")
    rig.send(P0, requested("t2"), "m2")

    assert rig.step() == 2

    t = rig.tables
    assert t.offsets[P0] == (1, 2)
    assert {k: (r.status, r.version) for k, r in t.sagas.items()} == {
        (SAGA, "t1"): ("active", 1),
        (SAGA, "t2"): ("active", 1),
    }
    assert rig.applied("t1") == ["m1"]
    assert rig.applied("t2") == ["m2"]
    assert rig.commands() == [(DEBIT, "t1"), (DEBIT, "t2")]
    assert sorted((d.ref.saga_id, d.ref.name, d.partition) for d in t.deadlines.values()) == [
        ("t1", PAYMENT_TIMEOUT, 0),
        ("t2", PAYMENT_TIMEOUT, 0),
    ]
    assert rig.consumer.advisory == [{P0: 2}]
    assert len(rig.committed) == 1
    assert (rig.worker.stats.batches, rig.worker.stats.records) == (1, 2)

    # Nothing new: nothing is read, nothing written.
    assert rig.step() == 0
    assert rig.store.writes == 1


def test_records_before_the_stored_position_are_not_read_again(rig: Rig) -> None:
    rig.send(P0, requested("t1"), "m1")
    rig.send(P0, requested("t2"), "m2")
    rig.tables.offsets[P0] = (4, 1)

    rig.consumer.assign([P0])
    rig.step()

    assert rig.tables.offsets[P0] == (5, 2)
    assert set(rig.tables.sagas) == {(SAGA, "t2")}


def test_the_next_batch_is_planned_on_top_of_the_one_committing(rig: Rig) -> None:
    rig.consumer.assign([P0])
    second_planned = threading.Event()
    seen_at_second_plan: list[object] = []

    def hold_first_commit() -> None:
        # Batch 1 may commit only once batch 2 has been planned: proves they overlap.
        if rig.store.writes == 1:
            assert second_planned.wait(WAIT), "the next batch was not planned meanwhile"

    plans = 0

    def note_plan() -> None:
        # Counted by plans, not writes: the first write may not have started yet on its lane.
        nonlocal plans
        plans += 1
        if plans == 2:
            seen_at_second_plan.append(dict(rig.tables.offsets))
            seen_at_second_plan.append(dict(rig.tables.sagas))
            second_planned.set()

    rig.hooks.on("before-commit", hold_first_commit)
    rig.hooks.on("before-write", note_plan)

    rig.send(P0, requested("t1"), "m1")
    assert rig.worker.poll_once() == 1
    rig.send(P0, debited("t1"), "m2")
    assert rig.worker.poll_once() == 1
    rig.worker.settle()

    # Batch 2 was planned while batch 1 had not committed anything yet...
    assert seen_at_second_plan == [{P0: (1, None)}, {}]
    # ...yet it continued from batch 1's saga version and offset, and both committed.
    assert rig.store.writes == 2
    assert rig.tables.offsets[P0] == (1, 2)
    row = rig.tables.sagas[(SAGA, "t1")]
    assert row.version == 2
    assert row.state is not None
    assert row.state["debit_confirmed"] is True
    assert rig.applied("t1") == ["m1", "m2"]
    assert rig.commands() == [(DEBIT, "t1"), (CREDIT, "t1")]
    # The debit confirmation cancelled the payment timeout that batch 1 scheduled.
    assert rig.tables.deadlines == {}
    assert rig.consumer.advisory == [{P0: 1}, {P0: 2}]
    assert rig.worker.stats.batches == 2


def test_a_fenced_batch_commits_nothing_and_its_partitions_are_dropped(rig: Rig) -> None:
    rig.consumer.assign([P0, P1])
    rig.send(P0, requested("t1"), "m1")
    rig.send(P1, requested("t2"), "m2")
    other = MemoryBatchStore(rig.tables)

    takeovers = [P0]

    def take_over() -> None:
        # Another replica claims P0 between this batch's plan and its write.
        if takeovers:
            other.claim([takeovers.pop()], "other")

    rig.hooks.on("before-write", take_over)
    rig.step()

    t = rig.tables
    assert t.sagas == {}
    assert t.history == []
    assert t.outbox == []
    assert t.deadlines == {}
    assert t.offsets == {P0: (2, None), P1: (1, None)}
    assert rig.worker.stats.rejected_batches == 1
    assert rig.committed == []
    assert rig.consumer.advisory == []
    assert set(rig.worker.owned) == {P1}
    assert rig.consumer.paused() == [P0]

    # P1 is still ours: its record is read again and committed; P0's never is.
    rig.send(P0, debited("t1"), "m3")
    assert rig.step() == 1
    assert set(t.sagas) == {(SAGA, "t2")}
    assert t.offsets == {P0: (2, None), P1: (1, 1)}
    assert rig.applied("t2") == ["m2"]


def test_a_retryable_failure_is_resynced_and_applied_exactly_once(rig: Rig) -> None:
    rig.consumer.assign([P0])
    rig.store.fail_before.append(Retryable("connection lost"))

    rig.send(P0, requested("t1"), "m1")
    assert rig.worker.poll_once() == 1
    # Planned on top of the batch that is about to fail: dropped with it.
    rig.send(P0, debited("t1"), "m2")
    assert rig.worker.poll_once() == 1
    rig.worker.settle()

    assert rig.tables.sagas == {}
    assert rig.tables.offsets[P0] == (1, None)
    assert rig.worker.stats.rejected_batches == 1
    assert (P0, None) in rig.consumer.seeks
    assert rig.consumer.position(P0) == 0

    # Both records are read again, now as one batch, and applied once.
    assert rig.step() == 2
    assert rig.step() == 0
    assert rig.tables.offsets[P0] == (1, 2)
    assert rig.applied("t1") == ["m1", "m2"]
    assert rig.commands() == [(DEBIT, "t1"), (CREDIT, "t1")]
    assert rig.tables.sagas[(SAGA, "t1")].version == 2
    assert rig.worker.owned[P0].next_offset == 2


def test_a_commit_in_doubt_that_happened_counts_as_committed(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="processor._runtime.consumer.worker")
    rig.consumer.assign([P0])
    rig.store.fail_after.append(CommitInDoubt("connection lost during COMMIT"))

    rig.send(P0, requested("t1"), "m1")
    rig.step()

    messages = [r.getMessage() for r in caplog.records]
    assert any("outcome unknown" in m for m in messages), messages
    assert any("outcome found: committed" in m for m in messages), messages
    assert rig.tables.offsets[P0] == (1, 1)
    assert rig.worker.owned[P0].next_offset == 1
    assert rig.consumer.position(P0) == 1

    # Not read again; the next event applies on top of it.
    rig.send(P0, debited("t1"), "m2")
    assert rig.step() == 1
    assert rig.applied("t1") == ["m1", "m2"]
    assert rig.commands() == [(DEBIT, "t1"), (CREDIT, "t1")]
    assert rig.tables.sagas[(SAGA, "t1")].version == 2
    assert rig.tables.offsets[P0] == (1, 2)


def test_a_commit_in_doubt_that_did_not_happen_is_read_again(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="processor._runtime.consumer.worker")
    rig.consumer.assign([P0])
    rig.store.fail_before.append(CommitInDoubt("connection lost during COMMIT"))

    rig.send(P0, requested("t1"), "m1")
    rig.step()

    assert any("outcome found: not committed" in r.getMessage() for r in caplog.records)
    assert rig.tables.sagas == {}
    assert rig.consumer.position(P0) == 0
    assert rig.step() == 1
    assert rig.applied("t1") == ["m1"]
    assert rig.commands() == [(DEBIT, "t1")]


def test_hooks_fire_around_the_write_and_the_commit(rig: Rig) -> None:
    rig.consumer.assign([P0])
    seen: list[tuple[str, str, bool]] = []

    def note(point: str) -> Callable[[], None]:
        def record() -> None:
            stored = (SAGA, "t1") in rig.tables.sagas
            seen.append((point, threading.current_thread().name.split("_")[0], stored))

        return record

    for point in ("before-write", "before-commit", "after-commit"):
        rig.hooks.on(point, note(point))

    rig.send(P0, requested("t1"), "m1")
    rig.step()

    consuming = threading.current_thread().name
    assert seen == [
        ("before-write", consuming, False),
        ("before-commit", "batch-writer", False),
        ("after-commit", "batch-writer", True),
    ]


def test_a_hook_that_raises_before_commit_rolls_the_batch_back(rig: Rig) -> None:
    rig.consumer.assign([P0])
    failures = [Retryable("injected")]

    def crash() -> None:
        if failures:
            raise failures.pop()

    rig.hooks.on("before-commit", crash)
    rig.send(P0, requested("t1"), "m1")
    rig.step()
    assert rig.tables.sagas == {}
    assert rig.tables.offsets[P0] == (1, None)

    rig.step()
    assert rig.applied("t1") == ["m1"]
    assert rig.tables.offsets[P0] == (1, 1)


def test_a_revoked_partition_is_no_longer_read(rig: Rig) -> None:
    rig.consumer.assign([P0, P1])
    rig.consumer.revoke([P1])
    rig.send(P0, requested("t1"), "m1")
    rig.send(P1, requested("t2"), "m2")

    assert rig.step() == 1
    assert set(rig.worker.owned) == {P0}
    assert set(rig.tables.sagas) == {(SAGA, "t1")}
    assert rig.tables.offsets[P1] == (1, None)


def test_a_fired_record_with_a_malformed_deadline_id_is_dead_lettered(rig: Rig) -> None:
    rig.consumer.assign([P0])
    fired = FiredRecord(SAGA, "t1", "not-a-uuid", PAYMENT_TIMEOUT, token=1)
    headers = [(k, v.encode()) for k, v in fired.headers().items()]
    rig.consumer.append(P0[0], P0[1], fired.value(), key=fired.key(), headers=headers)

    rig.step()

    assert rig.tables.offsets[P0] == (1, 1)
    assert len(rig.tables.dead_letters) == 1


def test_the_relay_sees_the_owned_epochs_and_is_woken_on_assignment() -> None:
    woken: list[dict[TP, int]] = []
    ownership = Ownership()
    with rigged(ownership=ownership, on_owned=lambda: woken.append(dict(ownership.epochs))) as rig:
        _relay_sees_the_owned_epochs(rig, woken)


def _relay_sees_the_owned_epochs(rig: Rig, woken: list[dict[TP, int]]) -> None:
    rig.consumer.assign([P0, P1])
    assert rig.worker.epochs == {P0: 1, P1: 1}
    assert woken == [{P0: 1, P1: 1}]

    snapshot = rig.worker.epochs
    rig.consumer.revoke([P1])
    assert rig.worker.epochs == {P0: 1}
    # Replaced, never changed in place: a reader on another thread holds a consistent map.
    assert snapshot == {P0: 1, P1: 1}

    # Fenced out of P0 by a new owner: gone from the relay's view too.
    MemoryBatchStore(rig.tables).claim([P0], "other")
    rig.send(P0, requested("t1"), "m1")
    rig.step()
    assert rig.worker.epochs == {}
    assert len(woken) == 1


def test_commands_and_dead_letters_carry_the_partition_of_their_input(rig: Rig) -> None:
    rig.consumer.assign([P0, P1])
    rig.send(P1, requested("t1"), "m1")
    rig.consumer.append(P0[0], P0[1], b"not json", key=b"t2", headers=[])
    rig.step()

    sources = {(row.saga_id or "dead letter", row.source) for row in rig.tables.outbox}
    assert sources == {("dead letter", P0), ("t1", P1)}
