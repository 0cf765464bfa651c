"""The simulated world: a broker, a database, replicas running the real loops, and a participant.

Everything here is in memory and driven by the scheduler (``tests.sim.run``): nothing runs
unless the scheduler calls it, and time is the world's own. The replicas are the production
``Worker``, ``Relay`` and ``DeadlinePoller`` over the in-memory adapters the contract suites
check against PostgreSQL and Kafka; this module only joins those adapters into one world (one
broker log read by every member, one database behind every store) and puts a fault in front of
each port call when the scheduler asks for one.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from processor._authoring.definition import definition_of
from processor._authoring.messages import registry
from processor._engine.partitioner import partition_for
from processor._engine.plan import Planner
from processor._engine.records import OffsetCommit, OutboxRow, Record
from processor._engine.rows import WriteSet
from processor._errors import CommitInDoubt, Retryable, SendFailure
from processor._invocation.binder import bind
from processor._memory.deadlines import MemoryDeadlineStore
from processor._memory.outbox import MemoryOutboxStore
from processor._memory.store import MemoryBatchStore, MemoryTables
from processor._ports import TP, DeadlineRow, Positions
from processor._runtime.consumer.worker import Worker
from processor._runtime.poller import DeadlinePoller
from processor._runtime.relay import Relay
from processor._wire import envelope
from processor.settings import DeadlineSettings
from tests.sim.kafka import SimClient, SimSagaConsumer
from tests.sim.lanes import SimFuture, SimLane
from tests.sim.model import COMMANDS, EVENTS, Opened, SimSaga, Stepped

__all__ = ["Broker", "Database", "Replica", "World"]

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DEAD_LETTERS = "sim-dead-letters"
PARTITIONS = 3


class Clock:
    """The world's time, in seconds from ``T0``; it only moves when the scheduler moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def datetime(self) -> datetime:
        return T0 + timedelta(seconds=self.now)


class Broker:
    """Partitioned logs every member reads: what the producers appended, in offset order."""

    def __init__(self) -> None:
        self.logs: dict[TP, list[Record]] = {}
        self.markers: dict[TP, set[int]] = {}
        self.partitions = {EVENTS: PARTITIONS, COMMANDS: PARTITIONS, DEAD_LETTERS: 1}
        for topic, n in self.partitions.items():
            for p in range(n):
                self.logs[(topic, p)] = []

    def append(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]],
        partition: int | None = None,
    ) -> Record:
        if partition is None:
            partition = partition_for(key or b"", self.partitions[topic], "murmur2")
        log = self.logs[(topic, partition)]
        record = Record(topic, partition, len(log), key, value, tuple(headers), None)
        log.append(record)
        return record

    def input_partitions(self) -> list[TP]:
        return [(EVENTS, p) for p in range(self.partitions[EVENTS])]


class Group:
    """The consumer group's coordinator: assigns the input partitions over the members."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.members: dict[str, Replica] = {}
        self.owner: dict[TP, str] = {}
        self.rebalances = 0

    def join(self, name: str) -> None:
        self.members[name].joined = True
        self.rebalance()

    def leave(self, name: str) -> None:
        """The member unsubscribed: its partitions are revoked (it sees so at its next poll)."""
        self._drop(name, "revoked")
        self.rebalance()

    def expel(self, name: str) -> None:
        """The member's session ran out (crashed, or frozen): its partitions move without it."""
        self._drop(name, "lost")
        self.rebalance()

    def _drop(self, name: str, kind: str) -> None:
        member = self.members[name]
        member.joined = False
        if kind == "lost":
            member.lost = True
        gone = [tp for tp, o in self.owner.items() if o == name]
        for tp in gone:
            del self.owner[tp]
        if gone or kind == "lost":
            # An expelled member learns it at its next poll even when it held nothing, and
            # joins again then.
            member.client.group_event(kind, gone)

    def rebalance(self) -> None:
        self.rebalances += 1
        live = sorted(n for n, m in self.members.items() if m.joined and m.alive)
        tps = self.broker.input_partitions()
        want = {tp: live[i % len(live)] for i, tp in enumerate(tps)} if live else {}
        # Every member is told what it gives up and what it takes; each learns at its next
        # poll, so a partition's new owner may claim it before the old one has seen it go.
        for name in live:
            gone = [tp for tp in tps if self.owner.get(tp) == name and want.get(tp) != name]
            if gone:
                for tp in gone:
                    del self.owner[tp]
                self.members[name].client.group_event("revoked", gone)
        for name in live:
            new = [tp for tp in tps if want.get(tp) == name and self.owner.get(tp) != name]
            if new:
                for tp in new:
                    self.owner[tp] = name
                self.members[name].client.group_event("assigned", new)


@dataclass
class Faults:
    """Faults the scheduler armed, taken by the next matching port call."""

    writes: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    down_until: dict[str, float] = field(default_factory=dict)
    produce: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    seeks: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def take_write(self, replica: str) -> str | None:
        pending = self.writes.get(replica)
        return pending.pop(0) if pending else None

    def take_seek(self, member: str) -> bool:
        if self.seeks.get(member):
            self.seeks[member] -= 1
            return True
        return False

    def take_produce(self, who: str) -> str | None:
        pending = self.produce.get(who)
        return pending.pop(0) if pending else None


class Database:
    """One database behind every store: the batch tables, the outbox, the deadlines, the lease."""

    def __init__(self, clock: Clock, faults: Faults) -> None:
        self.clock = clock
        self.faults = faults
        self.tables = MemoryTables()
        self.outbox = MemoryOutboxStore()
        self.deadlines = MemoryDeadlineStore(clock=clock.datetime)
        # One deadline table: the batches schedule and delete in it, the poller claims from it.
        self.deadlines._rows = self.tables.deadlines
        # What the invariants read: each committed outbox row's message id and bytes, in commit
        # order; which replica committed each (partition, epoch).
        self.committed: list[OutboxRow] = []
        self.writers: dict[tuple[TP, int], str] = {}
        # Each replica's committed batches, in commit order.
        self.commits: dict[str, list[WriteSet]] = defaultdict(list)
        # Batches whose commit went through after their replica gave up waiting for it: it
        # cannot know of them (their records are applied again, or fenced, by whoever comes).
        self.late_run = False
        self.late_ws: set[int] = set()
        # The offsets each batch tried to commit, by the batch's id().
        self.tried: dict[int, tuple[OffsetCommit, ...]] = {}
        self.violations: list[str] = []

    def sync_lease(self) -> None:
        """The batch tables read the lease token the deadline store holds (one row in SQL)."""
        lease = self.deadlines._lease
        self.tables.lease_token = lease.token if lease is not None else None


class SimStore(MemoryBatchStore):
    """A replica's connection to the world's database, failing when the scheduler says."""

    def __init__(self, db: Database, replica: str) -> None:
        super().__init__(db.tables, clock=db.clock.datetime)
        self.db = db
        self.replica = replica

    def _reachable(self) -> None:
        if self.db.faults.down_until.get(self.replica, -1.0) > self.db.clock.now:
            raise Retryable("simulated: the database does not answer this replica")

    def claim(self, partitions: Sequence[TP], owner: str) -> Positions:
        self._reachable()
        out = super().claim(partitions, owner)
        for tp, (epoch, _) in out.items():
            # The outbox's claims are fenced by the same epoch (the offsets row in SQL).
            self.db.outbox.epochs[tp] = epoch
        return out

    def read_offsets(self, partitions: Sequence[TP]) -> Positions:
        self._reachable()
        return super().read_offsets(partitions)

    def load(self, wants: Any) -> Any:
        self._reachable()
        return super().load(wants)

    def write(
        self,
        ws: WriteSet,
        offsets: Sequence[OffsetCommit],
        *,
        before_commit: Callable[[], None] | None = None,
        dry_run: bool = False,
    ) -> None:
        self._reachable()
        if not dry_run:
            self.db.tried[id(ws)] = tuple(offsets)
        fault = None if dry_run else self.db.faults.take_write(self.replica)
        if fault == "refuse":
            raise Retryable("simulated: the connection broke before the commit")
        super().write(ws, offsets, before_commit=before_commit, dry_run=dry_run)
        if dry_run:
            return
        self.db.outbox.append(ws.outbox)
        self.db.committed.extend(ws.outbox)
        self.db.commits[self.replica].append(ws)
        if self.db.late_run:
            self.db.late_ws.add(id(ws))
        for o in offsets:
            key = ((o.topic, o.partition), o.epoch)
            writer = self.db.writers.setdefault(key, self.replica)
            if writer != self.replica:
                self.db.violations.append(
                    f"{self.replica} committed {key[0]} under epoch {o.epoch}, owned by {writer}"
                )
        if fault == "in-doubt":
            raise CommitInDoubt("simulated: the connection broke while the commit went through")


class SimProducer:
    """Appends to the broker; a fault refuses a send, or appends and still reports failure."""

    def __init__(self, broker: Broker, faults: Faults, who: str) -> None:
        self.broker = broker
        self.faults = faults
        self.who = who

    def send(self, records: Sequence[OutboxRow], timeout: float) -> list[SendFailure]:
        fault = self.faults.take_produce(self.who)
        if fault == "refuse":
            return [
                SendFailure(i, "simulated: broker unavailable", False) for i in range(len(records))
            ]
        for row in records:
            headers = tuple((k, v.encode()) for k, v in row.headers.items())
            self.broker.append(row.topic, row.key, row.value, headers, row.partition)
        if fault == "lost-ack":
            return [
                SendFailure(i, "simulated: acknowledgement lost", False)
                for i in range(len(records))
            ]
        return []

    def flush(self, timeout: float) -> int:
        return 0

    def close(self, timeout: float) -> None:
        return None


class Replica:
    """One processor: its worker, relay and deadline poller over the world's broker and database.

    Attributes:
        alive: False once crashed (a new replica takes its place under a new name).
        joined: A member of the group now.
        frozen: Not scheduled (a long pause): the group expels it once its session runs out.
        lost: The group expelled it; it learns so at its next poll.
        skew: Its clock's offset from the world's (a clock jump).
    """

    def __init__(self, name: str, world: World, batch_size: int) -> None:
        self.name = name
        self.world = world
        self.alive = True
        self.joined = False
        self.frozen = False
        self.lost = False
        self.skew = 0.0
        # The batches its worker took as committed.
        self.reported: list[WriteSet] = []
        self.client = SimClient(
            world.broker, world.group, name, world.faults, random.Random(world.rng.getrandbits(64))
        )
        planner = world.planner()
        self.worker = Worker(
            store=SimStore(world.db, name),
            control=SimStore(world.db, name),
            planner=planner,
            registry=registry,
            owner=name,
            consumer=lambda a, r: SimSagaConsumer(self.client, a, r),
            max_record_bytes=1 << 20,
            batch_size=batch_size,
            batch_timeout=0.0,
            unavailable_timeout=20.0,
            clock=self.monotonic,
            on_commit=self.reported.append,
        )
        self.relay = Relay(
            world.db.outbox,
            SimProducer(world.broker, world.faults, f"{name}:relay"),
            owned=lambda: dict(self.worker.epochs),
        )
        self.poller = DeadlinePoller(
            world.db.deadlines,
            SimProducer(world.broker, world.faults, f"{name}:poller"),
            holder=name,
            settings=DeadlineSettings(),
            monotonic=self.monotonic,
        )

    def writes(self) -> list[SimFuture]:
        """Its batches handed to the write lane and not committed yet."""
        lane = self.worker._lanes._write_lane
        return lane.waiting() if isinstance(lane, SimLane) else []

    def monotonic(self) -> float:
        return self.world.clock.now + self.skew

    def crash(self) -> None:
        """Gone: its memory with it, its stored state kept; the group moves its partitions."""
        self.alive = False
        self.worker._lanes.close()
        self.world.group.expel(self.name)


class Participant:
    """Answers each ``Do`` it reads with ``Stepped``, unless the scheduler loses the reply."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.positions: dict[TP, int] = {}
        self.answered = 0

    def step(self, lose: Callable[[], bool], duplicate: Callable[[], bool]) -> int:
        n = 0
        for p in range(self.broker.partitions[COMMANDS]):
            tp = (COMMANDS, p)
            log = self.broker.logs[tp]
            start = self.positions.get(tp, 0)
            for record in log[start:]:
                n += 1
                if lose():
                    continue
                body = json.loads(record.value or b"{}")
                reply = Stepped(sim_id=body["sim_id"], n=body["n"])
                copies = 2 if duplicate() else 1
                for _ in range(copies):
                    self.answered += 1
                    publish(self.broker, reply, f"reply-{self.answered}", body["sim_id"])
            self.positions[tp] = len(log)
        return n


def publish(broker: Broker, event: Opened | Stepped, message_id: str, key: str) -> Record:
    """An event as a service publishes it: keyed by the saga id, with the wire headers."""
    entry = registry.of(type(event))
    headers = envelope(
        message_id=message_id,
        message_type=entry.name,
        schema_version=entry.version,
        correlation_id=key,
    )
    return broker.append(
        EVENTS,
        key.encode(),
        event.model_dump_json().encode(),
        tuple((k, v.encode()) for k, v in headers.items()),
    )


class World:
    """The broker, the database, the group, the replicas and the participant of one run."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.clock = Clock()
        self.faults = Faults()
        self.broker = Broker()
        self.db = Database(self.clock, self.faults)
        self.group = Group(self.broker)
        self.participant = Participant(self.broker)
        self.replicas: list[Replica] = []
        # Fired records a paused poller claimed and has not sent yet.
        self.paused_sends: list[tuple[Replica, int, list[DeadlineRow]]] = []
        # Commits that hung (their replica gave up waiting), which may still go through.
        self.hung: list[SimFuture] = []
        self._bound = bind(definition_of(SimSaga))
        self._ids = 0

    def planner(self) -> Planner:
        def deadline_ids() -> str:
            self._ids += 1
            return f"{self._ids:032x}"

        return Planner(
            {self._bound.saga_type: self._bound},
            registry=registry,
            dead_letter_topic=DEAD_LETTERS,
            deadline_ids=deadline_ids,
        )

    def start_replica(self, batch_size: int) -> Replica:
        name = f"r{len(self.replicas)}"
        replica = Replica(name, self, batch_size)
        self.replicas.append(replica)
        self.group.members[name] = replica
        # It joins the group at its first poll, as the Kafka adapter does.
        return replica

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive]

    def offsets(self) -> Mapping[TP, int | None]:
        return {tp: nxt for tp, (_, nxt) in self.db.tables.offsets.items()}
