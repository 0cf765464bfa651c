"""End-to-end fixtures: real processor processes, a transfer workload, and the invariant check.

Every e2e test drives the transfer saga the same way: it publishes a known set of events, runs
processor subprocesses (some with an injected fault), waits until everything drains, and then
asks `assert_invariants` whether the database and the command topic show exactly the effects
the input calls for.
"""

from __future__ import annotations

import re
import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from devstack import wait_for_kafka
from processor._authoring.messages import Message
from processor.settings import ProcessorSettings
from schemas.transfers import (
    ACCOUNT_COMMANDS_TOPIC,
    TRANSFER_EVENTS_TOPIC,
    CreditConfirmed,
    DebitConfirmed,
    TransferRequested,
)
from tests.support.harness import Publisher, Reader, create_topics, query, settings_for, wait_until
from tests.support.private_stack import PrivateStack
from tests.support.private_stack import private_stack as _private_stack
from tests.support.procs import ProcessorProcess
from tests.support.roles import LeastPrivilege
from tests.support.tell import tell_if_failed

TRANSFER_SAGA = "sagas.transfer:TransferSaga"
TRANSFER_APP = "sagas.app:transfer_app"
EVENT_TYPES = (
    "transfers.TransferRequested",
    "transfers.DebitConfirmed",
    "transfers.CreditConfirmed",
)
COMMAND_TYPES = ("transfers.DebitAccount", "transfers.CreditAccount")
DRAIN_TIMEOUT = 120.0


@dataclass
class Workload:
    """What the test published: per saga, the message ids of its events in publish order."""

    events: dict[str, list[str]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(len(ids) for ids in self.events.values())


@dataclass
class E2EEnv:
    """One test's world: its topic prefix, schema, processes and readers (all cleaned up)."""

    kafka: str
    db: str
    schema: str
    prefix: str
    logs: Path
    partitions: int
    # Processes connect as this (the runtime role of deploy/sql/grants.sql); `db` is the
    # administrator the test itself queries and disturbs with.
    process_db: str | None = None
    procs: list[ProcessorProcess] = field(default_factory=list)
    readers: list[Reader] = field(default_factory=list)

    @property
    def events_topic(self) -> str:
        return self.prefix + TRANSFER_EVENTS_TOPIC

    @property
    def commands_topic(self) -> str:
        return self.prefix + ACCOUNT_COMMANDS_TOPIC

    @property
    def group_id(self) -> str:
        return self.settings().consumer.group_id

    def settings(self, **overrides: Any) -> ProcessorSettings:
        if self.process_db is not None:
            # The runtime role cannot create tables: the owner role migrated them.
            deadline = overrides.pop("deadline", {})
            overrides["deadline"] = {**deadline, "schema": {"auto": False}}
        return settings_for(
            self.kafka,
            self.process_db or self.db,
            self.schema,
            self.prefix,
            sagas=[TRANSFER_SAGA],
            **overrides,
        )

    def start(
        self, name: str, fault: Mapping[str, str] | None = None, **overrides: Any
    ) -> ProcessorProcess:
        """Starts a processor subprocess named `name` (its instance id and `<name>.log`)."""
        overrides.setdefault("instance_id", name)
        proc = ProcessorProcess(
            self.settings(**overrides), self.logs / f"{name}.log", fault, app=TRANSFER_APP
        )
        self.procs.append(proc)
        return proc

    def reader(self) -> Reader:
        reader = Reader(self.kafka, [self.commands_topic])
        self.readers.append(reader)
        return reader

    def query(self, sql_text: str, *args: Any) -> list[tuple[Any, ...]]:
        return query(self.db, self.schema, sql_text, *args)

    def scalar(self, sql_text: str, *args: Any) -> Any:
        return self.query(sql_text, *args)[0][0]

    def end_offsets(self) -> dict[int, int]:
        """High watermarks of the input topic's partitions, as Kafka sees them now."""
        consumer = Consumer({"bootstrap.servers": self.kafka, "group.id": f"wm-{uuid.uuid4().hex}"})
        try:
            return {
                p: consumer.get_watermark_offsets(TopicPartition(self.events_topic, p), timeout=30)[
                    1
                ]
                for p in range(self.partitions)
            }
        finally:
            consumer.close()

    def stored_offsets(self) -> dict[int, int | None]:
        rows = self.query(
            "SELECT partition, next_offset FROM consumer_offset WHERE group_id = %s AND topic = %s",
            self.group_id,
            self.events_topic,
        )
        return {int(p): (None if n is None else int(n)) for p, n in rows}


@pytest.fixture
def e2e_env(
    request: pytest.FixtureRequest,
    kafka_bootstrap: str,
    database_url: str,
    least_privilege_db: LeastPrivilege,
    tmp_path: Path,
) -> Iterator[E2EEnv]:
    """A prefix with 6-partition event and 3-partition command topics, and this test's schema,
    migrated by its owner role; processes run as the runtime role."""
    prefix = f"e{uuid.uuid4().hex[:8]}."
    env = E2EEnv(
        kafka_bootstrap,
        database_url,
        least_privilege_db.schema,
        prefix,
        tmp_path,
        partitions=6,
        process_db=least_privilege_db.runtime_url,
    )
    create_topics(kafka_bootstrap, [env.events_topic], partitions=env.partitions)
    create_topics(kafka_bootstrap, [env.commands_topic, prefix + "saga-dead-letters"], partitions=3)
    try:
        yield env
    finally:
        # Processes first: a live processor must not outlast its schema being dropped.
        for proc in env.procs:
            proc.stop()
        tell_if_failed(request, env.procs)
        for reader in env.readers:
            reader.close()


@pytest.fixture(scope="session")
def _restarted_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateStack]:
    with _private_stack(tmp_path_factory.mktemp("restarted-stack")) as stack:
        yield stack


@pytest.fixture
def private_stack(_restarted_stack: PrivateStack) -> PrivateStack:
    """A PostgreSQL cluster and a Kafka broker that no shared-stack test uses (and may restart).

    The tests that restart them take turns on one stack (one start-up instead of one each):
    each uses schemas and topics of its own. Both services run when a test starts, whatever
    the test before it left stopped.
    """
    _restarted_stack.up_both()
    wait_for_kafka(_restarted_stack.kafka, timeout=120)
    return _restarted_stack


@pytest.fixture(scope="session")
def order_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateStack]:
    """A private stack, its broker behind a proxy, for the order-world tests to disturb.

    Shared by them (one start-up instead of one each): each uses schemas and topics of its
    own, and leaves the stack running, healed, whatever it did to it. Tests that restart the
    broker use a private stack instead: a broker restart behind the proxy can leave a
    consumer's coordinator connection waiting for good.
    """
    with _private_stack(tmp_path_factory.mktemp("order-stack"), proxied_kafka=True) as stack:
        yield stack


def new_workload(count: int) -> Workload:
    """`count` fresh transfer ids with no events published yet."""
    run = uuid.uuid4().hex[:6]
    return Workload({f"tr-{run}-{i:04d}": [] for i in range(count)})


def _step(tid: str, n: int) -> Message:
    amount = Decimal("10.00")
    if n == 0:
        return TransferRequested(
            transfer_id=tid, source_account_id="A", target_account_id="B", amount=amount
        )
    if n == 1:
        return DebitConfirmed(transfer_id=tid, account_id="A", amount=amount)
    return CreditConfirmed(transfer_id=tid, account_id="B", amount=amount)


def publish_steps(env: E2EEnv, workload: Workload, steps: range) -> None:
    """Publishes the given steps of every transfer, interleaved round-robin across sagas.

    Saga n's second event follows every saga's first, so one batch holds many sagas at mixed
    steps and each partition interleaves many sagas.
    """
    pub = Publisher(env.kafka)
    for n in steps:
        for tid, published in workload.events.items():
            assert len(published) == n, "steps must be published in order"
            mid = str(uuid.uuid4())
            pub.event(env.events_topic, tid, _step(tid, n), message_id=mid)
            published.append(mid)
    pub.flush()


def publish_transfers(env: E2EEnv, count: int) -> Workload:
    """Publishes `count` complete transfers (TransferRequested, DebitConfirmed, CreditConfirmed)."""
    workload = new_workload(count)
    publish_steps(env, workload, range(len(EVENT_TYPES)))
    return workload


def distinct_commands(reader: Reader) -> int:
    return len({reader.headers(m)["message-id"] for m in reader.records})


def wait_drained(env: E2EEnv, workload: Workload, reader: Reader) -> None:
    """Waits until every saga ended, the outbox is empty, offsets caught up and commands arrived."""
    n = len(workload.events)
    wait_until(
        lambda: env.scalar("SELECT count(*) FROM saga_instance WHERE status = 'ended'") == n,
        timeout=DRAIN_TIMEOUT,
        what=f"{n} sagas ended",
    )
    wait_until(
        lambda: env.scalar("SELECT count(*) FROM outbox") == 0,
        timeout=DRAIN_TIMEOUT,
        what="outbox drained",
    )
    ends = env.end_offsets()
    wait_until(
        lambda: {p: o or 0 for p, o in env.stored_offsets().items()} == ends,
        timeout=DRAIN_TIMEOUT,
        what=f"stored offsets reach the end offsets {ends}",
    )
    expected = n * len(COMMAND_TYPES)
    reader.wait_for(
        lambda _: distinct_commands(reader) >= expected,
        timeout=DRAIN_TIMEOUT,
        what=f"{expected} distinct commands",
    )


@dataclass(frozen=True)
class CommandReport:
    """What the command topic held when the invariants were checked."""

    total: int
    distinct: int
    duplicated_sagas: frozenset[str]

    @property
    def duplicates(self) -> int:
        return self.total - self.distinct


def assert_invariants(
    env: E2EEnv,
    workload: Workload,
    reader: Reader,
    *,
    duplicates_allowed: bool = False,
    grown: bool = False,
) -> CommandReport:
    """Checks I1-I4 and I7 for a drained transfer workload; returns what the topic held.

    Args:
        env: The test's environment.
        workload: What was published.
        reader: A reader of the command topic that has seen every command (see `wait_drained`).
        duplicates_allowed: Whether the command topic may hold a record more than once (only
            relay redelivery may cause that, and only under the same message id and value).
        grown: The input topic grew meanwhile: a saga's later events may come from a new
            partition, whose offsets start again, so offsets rise with versions only within
            one partition (the publish order is checked by message id all the same).
    """
    sagas = workload.events
    n = len(sagas)

    # I1/I2 and I7: every saga ended after exactly its three events, nothing parked or lost.
    rows = env.query("SELECT saga_id, status, version, state FROM saga_instance")
    assert len(rows) == n
    for saga_id, status, version, state in rows:
        assert saga_id in sagas, saga_id
        assert (status, version) == ("ended", 3), (saga_id, status, version)
        assert state["debit_confirmed"], (saga_id, state)
        assert state["credit_confirmed"], (saga_id, state)
        assert Decimal(str(state["amount"])) == Decimal("10.00")
    for table in ("outbox", "saga_deadline", "dead_letter", "parked_message"):
        assert env.scalar(f"SELECT count(*) FROM {table}") == 0, table

    # I2/I3: exactly one history row per input record, applied in publish order, with
    # contiguous versions and offsets rising with them.
    history: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for saga_id, mid, mtype, outcome, version, offset in env.query(
        'SELECT saga_id, message_id, message_type, outcome, version, "offset" '
        "FROM saga_history ORDER BY saga_id, id"
    ):
        history[saga_id].append((mid, mtype, outcome, version, offset))
    assert env.scalar("SELECT count(*) FROM saga_history") == workload.total
    for saga_id, published in sagas.items():
        rows_ = history[saga_id]
        assert [r[2] for r in rows_] == ["applied"] * len(published), (saga_id, rows_)
        assert [r[0] for r in rows_] == published, saga_id
        assert [r[1] for r in rows_] == list(EVENT_TYPES), saga_id
        assert [r[3] for r in rows_] == list(range(1, len(published) + 1)), saga_id
        offsets = [r[4] for r in rows_]
        assert grown or offsets == sorted(set(offsets)), (saga_id, offsets)

    # I4: the stored position of every input partition is one past its last record.
    ends = env.end_offsets()
    assert {p: o or 0 for p, o in env.stored_offsets().items()} == ends

    # Commands: one message id per command row; a repeat is byte-identical; per saga the first
    # occurrences are in saga order.
    by_id: dict[str, tuple[bytes, str, str]] = {}
    first_seen: dict[str, list[str]] = defaultdict(list)
    duplicated: set[str] = set()
    for msg in reader.records:
        h = reader.headers(msg)
        mid = h["message-id"]
        seen = (msg.value(), h["message-type"], h["saga-id"])
        if mid in by_id:
            assert by_id[mid] == seen, f"message id {mid} reused for a different command"
            duplicated.add(h["saga-id"])
            continue
        by_id[mid] = seen
        assert msg.key().decode() == h["saga-id"]
        first_seen[h["saga-id"]].append(h["message-type"])
    assert set(first_seen) == set(sagas)
    for saga_id, types in first_seen.items():
        assert types == list(COMMAND_TYPES), (saga_id, types)
    report = CommandReport(len(reader.records), len(by_id), frozenset(duplicated))
    assert report.distinct == n * len(COMMAND_TYPES)
    if not duplicates_allowed:
        assert report.duplicates == 0, f"{report.duplicates} commands published twice"
    return report


def log_lines(proc: ProcessorProcess, pattern: str) -> list[str]:
    """Lines of a process's output matching a regular expression."""
    rx = re.compile(pattern)
    return [line for line in proc.log().splitlines() if rx.search(line)]
