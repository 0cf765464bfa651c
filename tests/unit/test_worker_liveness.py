"""The worker under a failing or silent database: it keeps polling, gives its partitions back
when the database stays away, rejoins when it answers, and never stalls on one bad record.

Time is a fake clock the tests move; only the bounded waits on a silent store use real time,
kept to a fraction of a second.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import pytest

from processor._engine.records import OffsetCommit, Record
from processor._engine.rows import Loaded, Outcome, Wants, WriteSet
from processor._errors import LockBusy, RecordDataError, Retryable
from processor._memory.consumer import MemoryRecordConsumer
from processor._memory.store import MemoryBatchStore, MemoryTables
from processor._ports import TP, Positions
from processor._runtime.assembly import bind_sagas
from processor._runtime.consumer.batch import Limits
from processor._runtime.consumer.intake import CARRY_BATCHES, Intake
from processor._runtime.consumer.ownership import Ownership
from processor._runtime.consumer.stats import WorkerStats
from processor._runtime.consumer.worker import Worker
from processor.settings import ProcessorSettings
from sagas.transfer import TransferSaga
from tests.unit.test_worker import P0, P1, Rig, debited, requested

SAGA = "transfer-saga"
BOUND = 20.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Flaky(MemoryBatchStore):
    """A memory store that can be made unreachable, silent, or picky about message ids."""

    def __init__(self, tables: MemoryTables) -> None:
        super().__init__(tables)
        self.down = False
        self.silent = threading.Event()  # set: writes block until released
        self.release = threading.Event()
        self.refuse: set[str] = set()  # applied message ids the "database" refuses
        # Message ids refused however they are written (applied, held behind a parked saga).
        self.refuse_always: set[str] = set()
        self.commits_fail = False  # every write fails as retryable; reads still work
        self.busy = 0  # claims still to fail as if another session held the partitions' rows
        self.claims = 0  # claims tried
        self.writes = 0  # writes tried, trial writes included
        # Each write tried: the partitions of its offsets, and how many records it applied.
        self.written: list[tuple[set[int], int]] = []
        self.on_write: Callable[[], None] | None = None
        # Places (partition number % 2) whose node does not answer: reads and writes of their
        # partitions fail, the others' go on (tables distributed by bucket, one worker away).
        self.down_places: set[int] = set()

    def _gate(self, partitions: Iterable[TP] = ()) -> None:
        if self.down:
            raise Retryable("database unreachable")
        if any(p % 2 in self.down_places for _, p in partitions):
            raise Retryable("connection to the remote node 127.0.0.1:55451 failed")

    def claim(self, partitions: Sequence[TP], owner: str) -> Positions:
        self.claims += 1
        self._gate(partitions)
        if self.busy:
            self.busy -= 1
            raise LockBusy("rows busy (55P03): canceling statement due to lock timeout")
        return super().claim(partitions, owner)

    def read_offsets(self, partitions: Sequence[TP]) -> Positions:
        self._gate(partitions)
        return super().read_offsets(partitions)

    def load(self, wants: Wants) -> Loaded:
        self._gate()
        return super().load(wants)

    def write(
        self,
        ws: WriteSet,
        offsets: Sequence[OffsetCommit],
        *,
        before_commit: Callable[[], None] | None = None,
        dry_run: bool = False,
    ) -> None:
        self.writes += 1
        self.written.append(({o.partition for o in offsets}, len(ws.history)))
        if self.on_write is not None:
            self.on_write()
        if self.silent.is_set():
            self.release.wait(30)
        self._gate((o.topic, o.partition) for o in offsets)
        if self.commits_fail:
            raise Retryable("could not serialize access (40001)")
        if any(h.message_id in self.refuse and h.outcome is Outcome.APPLIED for h in ws.history):
            raise RecordDataError("22021", "invalid byte sequence for encoding")
        if any(h.message_id in self.refuse_always for h in ws.history):
            raise RecordDataError("22021", "invalid byte sequence for encoding")
        super().write(ws, offsets, before_commit=before_commit, dry_run=dry_run)


@dataclass
class Live:
    rig: Rig
    store: Flaky
    clock: Clock

    def step(self) -> int:
        return self.rig.step()


# The batch size of the workers of these tests.
BATCH_SIZE = 100


def _live(
    colocate: Callable[[TP], object] | None = None, committed: list[WriteSet] | None = None
) -> tuple[Live, Worker]:
    """A worker over the in-memory store that fails on demand, and its rig."""
    bound = bind_sagas(ProcessorSettings(database={"url": "postgresql://unused"}), [TransferSaga])
    tables = MemoryTables()
    store = Flaky(tables)
    clock = Clock()
    committed = [] if committed is None else committed
    worker = Worker(
        store=store,
        control=store,
        store_factory=lambda: store,
        planner=bound.planner,
        registry=bound.registry,
        owner="me",
        consumer=MemoryRecordConsumer,
        max_record_bytes=1 << 20,
        batch_size=BATCH_SIZE,
        batch_timeout=0.0,
        on_commit=committed.append,
        unavailable_timeout=BOUND,
        clock=clock,
        colocate=colocate,
    )
    consumer = worker.consumer
    assert isinstance(consumer, MemoryRecordConsumer)
    from processor._runtime.hooks import Hooks

    rig = Rig(tables, store, consumer, Hooks(), worker, committed)  # type: ignore[arg-type]
    return Live(rig, store, clock), worker


@pytest.fixture
def live() -> Iterator[Live]:
    made, worker = _live()
    try:
        yield made
    finally:
        made.store.release.set()
        worker.close()


@pytest.fixture
def colocated() -> Iterator[Live]:
    """A live worker whose partitions' rows live in two places: even and odd partitions."""
    made, worker = _live(colocate=lambda tp: tp[1] % 2)
    try:
        yield made
    finally:
        made.store.release.set()
        worker.close()


def test_an_unreachable_database_gives_the_partitions_back_then_rejoins(
    live: Live, caplog: pytest.LogCaptureFixture
) -> None:
    rig, store, clock = live.rig, live.store, live.clock
    rig.consumer.assign([P0, P1])
    rig.send(P0, requested("t1"), "m1")
    live.step()
    assert rig.applied("t1") == ["m1"]

    store.down = True
    rig.send(P0, requested("t2"), "m2")
    live.step()  # the plan fails; the worker keeps its partitions for now
    assert not rig.worker.detached
    assert rig.consumer.assignment() == [P0, P1]

    clock.now += BOUND - 1
    live.step()
    assert not rig.worker.detached, "gave up before the bound"

    caplog.set_level(logging.WARNING, logger="processor._runtime.consumer.worker")
    clock.now += 2
    live.step()
    assert rig.worker.detached
    assert rig.consumer.assignment() == []
    assert rig.worker.health()["detached"] is True
    assert any("giving this replica's partitions back" in r.message for r in caplog.records)

    # Still away: probes fail, nothing rejoins.
    clock.now += 10
    live.step()
    assert rig.worker.detached

    store.down = False
    clock.now += 10
    live.step()
    assert not rig.worker.detached
    assert any("answers again: rejoining" in r.message for r in caplog.records)
    assert rig.consumer.assignment() == [P0, P1]
    live.step()
    assert rig.applied("t2") == ["m2"]
    assert rig.tables.offsets[P0][1] == 2


def test_commits_that_keep_failing_while_reads_work_give_the_partitions_back(
    live: Live,
) -> None:
    rig, store, clock = live.rig, live.store, live.clock
    rig.consumer.assign([P0])
    rig.send(P0, requested("t1"), "m1")
    store.commits_fail = True
    # As the processor loops: each poll settles the batch the previous one submitted.
    for _ in range(int(BOUND)):
        rig.worker.poll_once()  # each commit fails; the offsets read back fine; redone
        assert not rig.worker.detached, "gave up before the bound"
        clock.now += 0.9
    clock.now += BOUND
    rig.worker.poll_once()
    rig.worker.poll_once()
    # The read-back after each failed commit ended the "outage" it had just begun: never.
    assert rig.worker.detached

    store.commits_fail = False
    clock.now += 10
    live.step()
    assert not rig.worker.detached
    live.step()
    live.step()
    assert rig.applied("t1") == ["m1"]


def test_a_short_outage_is_ridden_out_without_leaving_the_group(live: Live) -> None:
    rig, store, clock = live.rig, live.store, live.clock
    rig.consumer.assign([P0])
    store.down = True
    rig.send(P0, requested("t1"), "m1")
    for _ in range(5):
        clock.now += 1
        live.step()
    store.down = False
    clock.now += 6  # past the longest backoff
    for _ in range(3):
        live.step()
    assert not rig.worker.detached
    assert rig.applied("t1") == ["m1"]
    assert rig.tables.offsets[P0][1] == 1


def test_a_commit_that_never_answers_is_abandoned_as_in_doubt(
    live: Live, caplog: pytest.LogCaptureFixture
) -> None:
    rig, store = live.rig, live.store
    rig.worker.limits.unavailable_timeout = 0.2  # real seconds: the lane wait is real time
    rig.consumer.assign([P0])
    rig.send(P0, requested("t1"), "m1")
    caplog.set_level(logging.WARNING, logger="processor._runtime.consumer.worker")

    store.silent.set()  # the commit blocks, as on a black-holed connection
    rig.worker.poll_once()
    assert rig.worker.settle() is False
    messages = [r.message for r in caplog.records]
    assert any("commit outcome unknown" in m for m in messages)
    assert any("outcome found: not committed" in m for m in messages)

    store.silent.clear()
    store.release.set()
    live.clock.now += 10
    for _ in range(3):
        live.step()
    assert rig.applied("t1") == ["m1"], "applied exactly once after the silence"


def test_an_in_doubt_commit_is_resolved_once_the_offsets_can_be_read_again(
    live: Live, caplog: pytest.LogCaptureFixture
) -> None:
    rig, store = live.rig, live.store
    rig.worker.limits.unavailable_timeout = 0.2  # real seconds: the lane wait is real time
    rig.consumer.assign([P0])
    rig.send(P0, requested("t1"), "m1")
    caplog.set_level(logging.WARNING, logger="processor._runtime.consumer.worker")

    store.silent.set()  # the commit blocks, as on a black-holed connection ...
    rig.worker.poll_once()
    store.down = True  # ... and so does the read-back of the offsets
    assert rig.worker.settle() is False
    messages = [r.message for r in caplog.records]
    assert any("outcome still unknown" in m for m in messages)
    assert not any("outcome found" in m for m in messages)

    store.down = False
    store.silent.clear()  # new writes go through; the abandoned one stays blocked
    live.clock.now += 10
    # Was forgotten: only the offsets were read again, the batch never resolved. (Ten seconds
    # are past this test's bound: the partitions go back first, then the read resolves it.)
    live.step()
    live.step()
    assert any("outcome found: not committed" in r.message for r in caplog.records)
    rig.consumer.assign([P0])
    for _ in range(3):
        live.step()
    assert rig.applied("t1") == ["m1"], "applied exactly once after the silence"


def test_a_saga_whose_write_the_database_refuses_is_parked_and_the_rest_commit(
    live: Live,
) -> None:
    rig, store = live.rig, live.store
    rig.consumer.assign([P0])
    store.refuse = {"m3"}
    for i in range(1, 6):
        rig.send(P0, requested(f"t{i}"), f"m{i}")

    live.step()
    live.step()

    t = rig.tables
    assert [rig.applied(f"t{i}") for i in (1, 2, 4, 5)] == [["m1"], ["m2"], ["m4"], ["m5"]]
    assert rig.applied("t3") == []
    assert t.dead_letters == []
    row = t.sagas[(SAGA, "t3")]
    assert row.status == "parked"
    assert row.parked_reason == (
        "the database refused its writes (22021: invalid byte sequence for encoding)"
    )
    assert [(p.saga_id, p.record.offset) for p in t.parked] == [("t3", 2)]
    assert t.offsets[P0][1] == 5, "the partition moved past the refused record"


def test_a_record_refused_even_behind_its_parked_saga_is_dead_lettered(live: Live) -> None:
    rig, store = live.rig, live.store
    rig.consumer.assign([P0])
    store.refuse_always = {"m3"}  # its own bytes: refused wherever it is written
    for i in range(1, 6):
        rig.send(P0, requested(f"t{i}"), f"m{i}")

    live.step()
    live.step()

    t = rig.tables
    assert [rig.applied(f"t{i}") for i in (1, 2, 4, 5)] == [["m1"], ["m2"], ["m4"], ["m5"]]
    [letter] = t.dead_letters
    assert (letter.record.offset, letter.reason) == (2, "refused-by-database")
    assert "22021" in letter.detail
    assert (SAGA, "t3") not in t.sagas
    assert t.offsets[P0][1] == 5


def test_many_refused_sagas_are_found_in_few_trial_writes_while_the_consumer_polls(
    live: Live, caplog: pytest.LogCaptureFixture
) -> None:
    rig, store = live.rig, live.store
    rig.worker.limits.batch_size = 500
    rig.consumer.assign([P0])
    # 400 sagas; 50 of them refused at their first record, 10 more at their second.
    first = {f"m{i}" for i in range(0, 400, 8)}
    second = {f"n{i}" for i in range(4, 400, 40)}
    store.refuse = first | second
    for i in range(400):
        rig.send(P0, requested(f"t{i}"), f"m{i}")
    for i in range(4, 400, 40):
        rig.send(P0, debited(f"t{i}"), f"n{i}")
    polls = []
    consume = rig.consumer.consume

    def counting(max_records: int, timeout: float) -> list[Record]:
        polls.append(store.writes)
        return consume(max_records, timeout)

    rig.consumer.consume = counting  # type: ignore[method-assign]

    def tick() -> None:
        live.clock.now += 0.5  # each trial write takes half a second of the worker's clock

    store.on_write = tick
    caplog.set_level(logging.WARNING, logger="processor._runtime.consumer.isolate")
    live.step()
    live.step()

    refused = {i for i in range(0, 400, 8)} | set(range(4, 400, 40))
    t = rig.tables
    parked = {sid for (_, sid), row in t.sagas.items() if row.status == "parked"}
    assert parked == {f"t{i}" for i in refused}
    assert t.dead_letters == []
    # Parked at their first record of the batch, the later one held behind it in order.
    held = [p.record.offset for p in t.parked if p.saga_id == "t4"]
    assert held == [4, 400]
    assert all(rig.applied(f"t{i}") == [f"m{i}"] for i in range(400) if i not in refused)
    assert t.offsets[P0][1] == 410
    # 60 refused among 410: about 60 x (2 (log2(410 / 60) + 1) + 1) trials, not 60 searches
    # over the whole batch.
    assert store.writes < 60 * 2 * 5, store.writes
    [summary] = [r.message for r in caplog.records if "trial writes (" in r.message]
    assert "refused the writes of 60 saga(s), parked, and 0 record(s), dead-lettered" in summary
    # The consumer kept polling through the search, about once a second of it.
    during = [w for w in polls if 1 < w < store.writes - 1]
    assert len(during) >= store.writes // 4, (len(during), store.writes)


def test_a_revocation_before_the_refused_records_are_isolated_does_not_stop_the_worker(
    live: Live,
) -> None:
    rig, store = live.rig, live.store
    rig.consumer.assign([P0])
    store.refuse = {"m3"}
    for i in range(1, 6):
        rig.send(P0, requested(f"t{i}"), f"m{i}")
    rig.worker.poll_once()  # the batch goes to the write lane, where the database refuses it
    rig.consumer.revoke([P0])  # before the worker settles it and isolates the record

    # Raised KeyError: the isolation asked this replica's ownership now for the offsets.
    rig.worker.settle()

    # Isolated under the epoch the batch had (no other owner claimed the partition since).
    assert [rig.applied(f"t{i}") for i in (1, 2, 4, 5)] == [["m1"], ["m2"], ["m4"], ["m5"]]
    assert rig.tables.sagas[(SAGA, "t3")].status == "parked"
    assert rig.tables.offsets[P0][1] == 5


def test_batches_end_at_the_byte_bound_and_nothing_is_lost(live: Live) -> None:
    rig = live.rig
    rig.worker.limits.max_batch_bytes = 1000  # each event's value is about 150 bytes
    rig.consumer.assign([P0])
    for i in range(20):
        rig.send(P0, requested(f"t{i}"), f"m{i}")

    sizes = []
    while (n := live.step()) or rig.worker.carried:
        sizes.append(n)
    assert max(sizes) < 20
    assert all(rig.applied(f"t{i}") == [f"m{i}"] for i in range(20))
    assert rig.tables.offsets[P0][1] == 20


def test_partitions_that_cannot_be_claimed_wait_paused_until_they_can(live: Live) -> None:
    rig, store, clock = live.rig, live.store, live.clock
    rig.send(P0, requested("t1"), "m1")
    store.down = True
    rig.consumer.assign([P0])  # the claim fails inside the rebalance callback
    live.step()
    assert P0 in rig.consumer.paused()
    assert rig.applied("t1") == []

    store.down = False
    clock.now += 10
    live.step()
    live.step()
    assert P0 not in rig.consumer.paused()
    assert rig.applied("t1") == ["m1"]


def test_a_replica_that_cannot_claim_any_partition_gives_them_back_after_the_bound(
    live: Live,
) -> None:
    rig, store, clock = live.rig, live.store, live.clock
    store.down = True
    rig.consumer.assign([P0, P1])  # both claims fail inside the rebalance callback
    live.step()
    clock.now += BOUND - 1
    live.step()
    assert not rig.worker.detached, "gave up before the bound"

    clock.now += 2
    live.step()  # held them for good: a failed claim never asked whether to give them back
    assert rig.worker.detached
    assert rig.consumer.assignment() == []


def test_claims_while_the_database_is_down_back_off_instead_of_one_per_poll(live: Live) -> None:
    rig, store, clock = live.rig, live.store, live.clock
    store.down = True
    rig.consumer.assign([P0])  # the first try, inside the rebalance callback
    for _ in range(5):
        live.step()
    assert store.claims == 1
    tried = []
    for _ in range(4):
        clock.now += 0.1
        live.step()
        tried.append(store.claims)
    # Waits of 0.1, 0.2, 0.4 s between tries: the second, fourth and eighth tenth of a second.
    assert tried == [2, 2, 3, 3]
    store.down = False
    clock.now += 0.4
    live.step()
    assert P0 not in rig.consumer.paused()


def test_partitions_busy_with_the_previous_owners_relay_wait_without_an_outage(
    live: Live,
) -> None:
    rig, store, clock = live.rig, live.store, live.clock
    rig.send(P0, requested("t1"), "m1")
    store.busy = 3
    rig.consumer.assign([P0])  # busy in the rebalance callback
    assert store.busy == 2
    live.step()
    # Not tried again on every poll: once per retry interval.
    assert store.busy == 2
    for _ in range(3):
        clock.now += BOUND  # far longer than an outage may last: still no give-back
        live.step()
        assert rig.worker.health()["unavailable_for"] == 0.0
        assert not rig.worker.detached
    assert store.busy == 0
    assert P0 not in rig.consumer.paused()
    live.step()
    assert rig.applied("t1") == ["m1"]


def test_a_commit_that_hangs_counts_as_down_from_when_it_was_submitted(live: Live) -> None:
    """The bound runs from the start of the hung commit, not from when the wait gave up: a
    replica cut off mid-commit gave its partitions back after twice the bound."""
    rig, store = live.rig, live.store
    rig.worker.limits.unavailable_timeout = (
        0.2  # the lane wait (real seconds) and the bound (clock)
    )
    rig.consumer.assign([P0])
    rig.send(P0, requested("t1"), "m1")
    store.silent.set()  # the commit blocks, as on a black-holed connection
    rig.worker.poll_once()  # submitted at the clock's now
    store.down = True  # and nothing else answers either
    live.clock.now += 0.15  # the commit has hung this long when the wait gives up
    assert rig.worker.settle() is False
    assert rig.worker.health()["unavailable_for"] == pytest.approx(0.15)
    assert not rig.worker.detached
    live.clock.now += 0.06  # 0.21 since the commit began: past the bound
    rig.worker.poll_once()
    assert rig.worker.detached


def test_an_in_doubt_commit_is_resolved_when_a_detached_replica_finds_the_database_again(
    live: Live, caplog: pytest.LogCaptureFixture
) -> None:
    rig, store = live.rig, live.store
    rig.worker.limits.unavailable_timeout = 0.2  # real seconds: the lane wait is real time
    rig.consumer.assign([P0])
    rig.send(P0, requested("t1"), "m1")
    caplog.set_level(logging.WARNING, logger="processor._runtime.consumer.worker")

    store.silent.set()  # the commit blocks, as on a black-holed connection ...
    rig.worker.poll_once()
    store.down = True  # ... and so does everything else, past the bound
    assert rig.worker.settle() is False
    for _ in range(3):
        live.clock.now += 10
        live.step()
    assert rig.worker.detached, "the partitions went back to the group"
    assert not any("outcome found" in r.message for r in caplog.records)

    store.down = False
    store.silent.clear()
    live.clock.now += 10
    live.step()  # the probe answers: the replica rejoins, and the batch must not be forgotten
    assert not rig.worker.detached
    assert any("outcome found: not committed" in r.message for r in caplog.records)
    rig.consumer.assign([P0])
    for _ in range(3):
        live.clock.now += 1
        live.step()
    assert rig.applied("t1") == ["m1"], "applied exactly once after the outage"


def _colocated_run(sent: Sequence[tuple[TP, str, str]]) -> tuple[Live, Worker]:
    """A worker whose P0 and P1 rows live on different workers, run over ``sent`` (partition,
    saga id, message id) until nothing is left to read or carried; closed."""
    made, worker = _live(colocate=lambda tp: tp[1] % 2)
    rig, store = made.rig, made.store
    try:
        rig.consumer.assign([P0, P1])
        for tp, tid, mid in sent:
            rig.send(tp, requested(tid), mid)
        steps = 0
        while (rig.step() or worker.carried) and steps < 50:
            steps += 1
        worker.settle()
    finally:
        store.release.set()
        worker.close()
    return made, worker


def test_with_colocated_partitions_each_batch_holds_one_places_records_and_none_is_lost() -> None:
    # Tables distributed by bucket: P0's and P1's rows live on different workers, so a batch
    # takes one worker's partitions and carries the other's records to the next batch.
    # Three batches' worth: the other place's records are carried while a batch of one place
    # fills, and a batch taken from what was carried still holds at most a batch's worth.
    total = 300
    made, worker = _colocated_run([(P0 if i % 3 else P1, f"t{i}", f"m{i}") for i in range(total)])
    rig, store, tables = made.rig, made.store, made.rig.tables
    places = [{p % 2 for p in partitions} for partitions, _ in store.written]
    sizes = [n for _, n in store.written]
    assert places
    assert all(len(p) == 1 for p in places), places
    assert {0, 1} <= set().union(*places)
    assert max(sizes) <= worker.batch_size, sizes
    assert all(rig.applied(f"t{i}") == [f"m{i}"] for i in range(total))
    assert tables.offsets[P0][1] == 200
    assert tables.offsets[P1][1] == 100


def test_with_colocated_partitions_a_place_short_of_a_batch_gives_way_then_goes_next() -> None:
    # One record of P0's place, then more of P1's than the carry holds: rather than a batch of
    # one record, full batches of P1's place go first while P0's records gather; P0's record
    # goes in a batch of its own after CARRY_BATCHES of them, however many of P1's keep coming.
    batch = BATCH_SIZE
    sent = [(P0, "a0")] + [(P1, f"b{i}") for i in range((2 * CARRY_BATCHES + 3) * batch)]
    made, _ = _colocated_run([(tp, tid, f"m-{tid}") for tp, tid in sent])
    rig, store = made.rig, made.store
    written = [(set(partitions), n) for partitions, n in store.written]
    assert written[:CARRY_BATCHES] == [({1}, batch)] * CARRY_BATCHES, written
    assert written[CARRY_BATCHES] == ({0}, 1), written
    assert all(n == batch for _, n in written[CARRY_BATCHES + 1 : -1]), written
    assert all(rig.applied(tid) == [f"m-{tid}"] for _, tid in sent)


def test_with_colocated_partitions_a_batch_from_carried_records_holds_a_batchs_worth() -> None:
    # One record of P0's place, then many of P1's: the batch of P0's place carries P1's records
    # (up to a few batches' worth) while it looks for more of its own, and the batches then
    # taken from what was carried hold at most a batch each.
    sent = [(P0, "a0")] + [(P1, f"b{i}") for i in range(450)] + [(P0, "a1")]
    made, worker = _colocated_run([(tp, tid, f"m-{tid}") for tp, tid in sent])
    rig, store = made.rig, made.store
    sizes = [n for _, n in store.written]
    assert max(sizes) <= worker.batch_size, sizes
    assert all(rig.applied(tid) == [f"m-{tid}"] for _, tid in sent)


def test_with_colocated_partitions_a_place_that_stops_answering_holds_back_only_its_own(
    colocated: Live, caplog: pytest.LogCaptureFixture
) -> None:
    # P0's rows live on a worker that stops answering: P0 waits, paused, for as long as it
    # takes (past the bound after which a database away gives every partition back), while
    # P1's batches go on; once it answers, P0 goes on from its stored position, each record
    # applied once.
    made, worker = colocated, colocated.rig.worker
    rig, store, clock = made.rig, made.store, made.clock
    caplog.set_level(logging.INFO, logger="processor._runtime.consumer.worker")
    rig.consumer.assign([P0, P1])
    rig.send(P0, requested("a0"), "ma0")
    rig.send(P1, requested("b0"), "mb0")
    for _ in range(4):
        made.step()
    assert rig.applied("a0") == ["ma0"]
    assert rig.applied("b0") == ["mb0"]

    store.down_places = {0}
    rig.send(P0, requested("a1"), "ma1")
    rig.send(P1, requested("b1"), "mb1")
    for i in range(2, 6):
        made.step()
        clock.now += BOUND / 2
        rig.send(P1, requested(f"b{i}"), f"mb{i}")
    for _ in range(4):
        made.step()
    worker.settle()
    assert rig.applied("a1") == []
    assert all(rig.applied(f"b{i}") == [f"mb{i}"] for i in range(1, 6))
    assert not worker.detached, "gave every partition back for one place's outage"
    assert rig.consumer.assignment() == [P0, P1]
    assert worker.health()["waiting_on_node"] == 1
    assert worker.stats.partitions_away == 1
    assert any("wait until it answers" in r.message for r in caplog.records)

    store.down_places = set()
    clock.now += 10
    for _ in range(4):
        made.step()
    worker.settle()
    assert rig.applied("a1") == ["ma1"], "applied once after its place answered"
    assert worker.health()["waiting_on_node"] == 0
    assert any("answers again" in r.message for r in caplog.records)
    assert rig.tables.offsets[P0][1] == 2
    assert rig.tables.offsets[P1][1] == 6


def test_with_colocated_partitions_a_rebalance_while_a_place_is_away_claims_the_others(
    colocated: Live, caplog: pytest.LogCaptureFixture
) -> None:
    # Partitions assigned while P0's node does not answer: P1 is claimed and goes on at once;
    # P0 waits, unclaimed and paused, past the bound (idle or not), counted as waiting on its
    # node; once the node answers it is claimed and its record applied once.
    made, worker = colocated, colocated.rig.worker
    rig, store, clock = made.rig, made.store, made.clock
    caplog.set_level(logging.INFO, logger="processor._runtime.consumer.worker")
    store.down_places = {0}
    rig.send(P0, requested("a0"), "ma0")
    rig.send(P1, requested("b0"), "mb0")
    rig.consumer.assign([P0, P1])  # P0's claim fails inside the rebalance callback
    for _ in range(3):
        made.step()
    worker.settle()
    assert rig.applied("b0") == ["mb0"]
    assert rig.applied("a0") == []
    assert P0 in rig.consumer.paused()
    for _ in range(4):
        clock.now += BOUND / 2
        made.step()
    assert not worker.detached, "gave every partition back for one place's outage"
    assert rig.consumer.assignment() == [P0, P1]
    assert worker.health()["waiting_on_node"] == 1
    assert any("their rows live on 0" in r.message for r in caplog.records)

    store.down_places = set()
    clock.now += 10
    for _ in range(4):
        made.step()
    worker.settle()
    assert rig.applied("a0") == ["ma0"]
    assert P0 not in rig.consumer.paused()
    assert worker.health()["waiting_on_node"] == 0
    assert rig.tables.offsets[P0][1] == 1


def test_with_colocated_partitions_claims_failing_everywhere_give_them_back_after_the_bound(
    colocated: Live,
) -> None:
    made, worker = colocated, colocated.rig.worker
    rig, store, clock = made.rig, made.store, made.clock
    store.down_places = {0, 1}
    rig.consumer.assign([P0, P1])
    made.step()
    clock.now += BOUND - 1
    made.step()
    assert not worker.detached, "gave up before the bound"
    clock.now += 2
    made.step()
    assert worker.detached
    assert rig.consumer.assignment() == []


def test_with_colocated_partitions_large_records_bound_the_carry_by_bytes() -> None:
    # One small record of P0's place, then large ones of P1's: the batch of P0's place reads on
    # for more of its own only while the other place's carried records stay under
    # CARRY_BATCHES batches' worth of bytes, not only of records (400 of these, 800 kB).
    consumer = MemoryRecordConsumer(on_assign=dict.fromkeys)
    consumer.assign([P0, P1])
    consumer.append(*P0, b"x" * 10)
    for _ in range(CARRY_BATCHES * BATCH_SIZE + 50):
        consumer.append(*P1, b"y" * 2_000)
    limits = Limits(
        batch_size=BATCH_SIZE,
        batch_timeout=0.0,
        max_batch_bytes=10_000,
        max_record_bytes=1 << 20,
        unavailable_timeout=BOUND,
    )
    intake = Intake(
        consumer,
        Ownership(),
        limits,
        WorkerStats(),
        follow=None,
        clock=lambda: 0.0,
        colocate=lambda tp: tp[1] % 2,
    )
    batch = intake.take()
    read = len(batch) + len(intake.carry)
    # One poll's worth (a batch's count of records), not CARRY_BATCHES of them.
    assert read <= BATCH_SIZE, read
    # A full batch of P1's place, by bytes, went first; P0's record waits its turn, carried.
    assert {(r.topic, r.partition) for r in batch} == {P1}
    assert sum(len(r.value or b"") for r in batch) <= limits.max_batch_bytes
    assert [r.offset for r in intake.carry if (r.topic, r.partition) == P0] == [0]
