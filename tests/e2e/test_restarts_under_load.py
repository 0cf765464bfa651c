"""PostgreSQL and the Kafka broker restart under load; nobody has to do anything.

Three processor replicas and the demo's accounts service run against a private PostgreSQL
cluster and Kafka broker (never the shared ones) while transfer requests keep arriving.
PostgreSQL is stopped and started again, then the broker. Every transfer saga must end, every
account step be applied once (money is conserved), and no replica exit.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from demo.accounts import AccountsService
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC, TransferRequested
from tests.e2e.conftest import TRANSFER_SAGA
from tests.support.harness import create_topics, headers_for, query, settings_for, wait_until
from tests.support.private_stack import PrivateStack
from tests.support.procs import ProcessorProcess
from tests.support.tell import notice, replaced_clients

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

ACCOUNTS = {f"acc{i}": Decimal("10000.00") for i in range(8)}
REPLICAS = 3
# Transfer requests per second while the load runs.
RATE = 20
SCHEMA = "restarts"


# Seconds without an acknowledgement, requests waiting, after which the load replaces its
# producer (see Load).
STALL = 30


@dataclass
class Load:
    """Publishes transfer requests at a steady rate until stopped; rides out broker outages.

    Like any producer that must not lose a request, it keeps each one until the broker
    acknowledges it, and sends the unacknowledged ones again through a new producer when
    acknowledgements stop for ``STALL`` seconds: librdkafka (up to at least 2.16) can leave a
    partition's records queued for good after the broker reports the partition without a
    leader, as a lone broker does while it shuts down (it logs "new leader-1 not found in
    cache"; confluentinc/librdkafka#5430). A request sent twice carries the same message id,
    which the processor applies once.
    """

    kafka: str
    topic: str
    published: list[str] = field(default_factory=list)
    errors: list[KafkaError] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    # Requests not yet acknowledged, in order: key -> (value, headers).
    waiting: dict[bytes, tuple[bytes, list[tuple[str, str | bytes | None]]]] = field(
        default_factory=dict
    )
    # Producers replaced after a stall, for the failure report.
    replaced: int = 0
    _generation: int = 0
    _acked_at: float = 0.0

    def run(self) -> None:
        self._producer = self._new_producer()
        names = sorted(ACCOUNTS)
        run = uuid.uuid4().hex[:6]
        n = 0
        while not self.stop.wait(1 / RATE):
            tid = f"tr-{run}-{n:05d}"
            msg = TransferRequested(
                transfer_id=tid,
                source_account_id=names[n % len(names)],
                target_account_id=names[(n + 3) % len(names)],
                amount=Decimal("1.25"),
            )
            if not self.waiting:
                self._acked_at = time.monotonic()  # a stall counts from the oldest request
            self.waiting[tid.encode()] = (msg.model_dump_json().encode(), [*headers_for(msg)])
            self._send(tid.encode())
            self._producer.poll(0)
            self._unstall()
            self.published.append(tid)
            n += 1
        deadline = time.monotonic() + 600
        while self.waiting:
            assert time.monotonic() < deadline, f"{len(self.waiting)} requests unacknowledged"
            self._producer.poll(0.5)
            self._unstall()

    def _new_producer(self) -> Producer:
        return Producer(
            {
                "bootstrap.servers": self.kafka,
                "enable.idempotence": True,
                "linger.ms": 5,
                # Longer than any outage here: a request waits for the broker instead of failing.
                "message.timeout.ms": 600_000,
            }
        )

    def _send(self, key: bytes) -> None:
        value, headers = self.waiting[key]
        generation = self._generation
        self._producer.produce(
            self.topic,
            key=key,
            value=value,
            headers=headers,
            on_delivery=lambda err, msg: self._delivered(generation, key, err),
        )

    def _unstall(self) -> None:
        if not self.waiting or time.monotonic() - self._acked_at < STALL:
            return
        self.replaced += 1
        old, self._producer = self._producer, self._new_producer()
        self._generation += 1
        old.purge()  # its reports belong to an old generation and are ignored
        old.poll(0)
        for key in list(self.waiting):
            self._send(key)
        self._acked_at = time.monotonic()

    def _delivered(self, generation: int, key: bytes, err: KafkaError | None) -> None:
        if generation != self._generation:
            return
        if err is not None:
            self.errors.append(err)
            return
        self.waiting.pop(key, None)
        self._acked_at = time.monotonic()


@dataclass
class World:
    stack: PrivateStack
    prefix: str
    logs: Path
    procs: list[ProcessorProcess] = field(default_factory=list)

    def db(self, sql: str, *args: object) -> list[tuple[object, ...]]:
        return query(self.stack.database, SCHEMA, sql, *args)

    def count(self, sql: str, *args: object) -> int:
        """A count, or -1 while the database is down."""
        try:
            value = self.db(sql, *args)[0][0]
        except Exception:  # the server is being restarted
            return -1
        assert isinstance(value, int)
        return value

    def ended(self) -> int:
        return self.count("SELECT count(*) FROM saga_instance WHERE status = 'ended'")

    def report(self, load: Load, service: AccountsService) -> str:
        """Where the sagas stand, for a failure message: what is stuck and who holds it."""
        lines: list[str] = []
        try:
            status = self.db("SELECT status, count(*) FROM saga_instance GROUP BY 1")
            started = {r[0] for r in self.db("SELECT saga_id FROM saga_instance")}
            missing = [t for t in load.published if t not in started]
            lines.append(f"sagas by status {status}; never started {len(missing)} {missing[:3]}")
            lines.append(
                f"load: {len(load.published)} requests, {len(load.waiting)}"
                f" unacknowledged, producer replaced {load.replaced} time(s)"
            )
            for saga_id, state, updated in self.db(
                "SELECT saga_id, state, updated_at FROM saga_instance WHERE status <> 'ended'"
                " ORDER BY updated_at LIMIT 5"
            ):
                last = self.db(
                    'SELECT message_type, kind, outcome, partition, "offset" FROM saga_history'
                    " WHERE saga_id = %s ORDER BY id DESC LIMIT 3",
                    saga_id,
                )
                lines.append(f"  open {saga_id} updated {updated} state {state} last {last}")
            if missing:
                lines.append(self._missing(missing[:3]))
            outbox = self.db("SELECT topic, count(*) FROM outbox GROUP BY 1")
            positions = self.db("SELECT partition, next_offset, owner FROM consumer_offset")
            lines.append(f"outbox by topic {outbox}; positions {positions}")
        except Exception as e:  # the report must not hide the failure it explains
            lines.append(f"database unreadable: {e!r}")
        ends: dict[str, object] = {}
        probe = Consumer({"bootstrap.servers": self.stack.kafka, "group.id": "report"})
        try:
            for topic in (TRANSFER_EVENTS_TOPIC, ACCOUNT_COMMANDS_TOPIC):
                ends[topic] = [
                    probe.get_watermark_offsets(TopicPartition(self.prefix + topic, p), 10)[1]
                    for p in range(6 if topic == TRANSFER_EVENTS_TOPIC else 3)
                ]
        except Exception as e:
            ends["error"] = repr(e)
        finally:
            probe.close()
        lines.append(f"log ends {ends}; accounts {service.counters}")
        try:
            # The accounts service's own stored positions: behind the log ends, it stopped
            # reading; at them with commands unhandled, it skipped some.
            schema = f'"accounts_{self.prefix.rstrip(".")}"'
            stored = self.db(
                f"SELECT partition, next_offset, owner FROM {schema}.consumer_offset"
                " ORDER BY partition"
            )
            replies = self.db(f"SELECT count(*) FROM {schema}.outbox")
            lines.append(f"accounts positions {stored}; replies waiting in its outbox {replies}")
        except Exception as e:
            lines.append(f"accounts positions unreadable: {e!r}")
        for p in self.procs:
            # Not DEBUG; ERROR and CRITICAL say why a replica ended.
            levels = (" INFO ", " WARNING ", " ERROR ", " CRITICAL ")
            tail = [ln for ln in p.log().splitlines() if any(lv in ln for lv in levels)][-12:]
            lines.append(f"{p.log_path.name} alive={p.alive()}:\n    " + "\n    ".join(tail))
        return "\n".join(lines)

    def _missing(self, ids: list[str]) -> str:
        """Where requests that started no saga sit in the log, and what the database holds."""
        found: dict[str, tuple[int, int]] = {}
        reader = Consumer(
            {
                "bootstrap.servers": self.stack.kafka,
                "group.id": "report",
                "enable.partition.eof": True,
            }
        )
        try:
            topic = self.prefix + TRANSFER_EVENTS_TOPIC
            reader.assign([TopicPartition(topic, p, 0) for p in range(6)])
            eofs: set[int] = set()
            while len(eofs) < 6 and len(found) < len(ids):
                msg = reader.poll(5)
                if msg is None:
                    break
                if msg.error():
                    eofs.add(int(msg.partition() or 0))
                elif (key := (msg.key() or b"").decode()) in ids:
                    found.setdefault(key, (int(msg.partition() or 0), int(msg.offset() or 0)))
        finally:
            reader.close()
        history = self.db(
            'SELECT saga_id, kind, outcome, partition, "offset" FROM saga_history'
            " WHERE saga_id = ANY(%s)",
            ids,
        )
        dead = self.db('SELECT partition, "offset", reason FROM dead_letter')
        return (
            f"missing in the log at (partition, offset) {found}; their history {history};"
            f" dead letters {dead[:5]}"
        )

    def start(self, name: str) -> ProcessorProcess:
        settings = settings_for(
            self.stack.kafka,
            self.stack.database,
            SCHEMA,
            self.prefix,
            sagas=[TRANSFER_SAGA],
            instance_id=name,
            # Shorter than the outages, so replicas give their partitions back and rejoin.
            consumer={"unavailable_timeout": "8s"},
        )
        proc = ProcessorProcess(settings, self.logs / f"{name}.log")
        self.procs.append(proc)
        return proc


@pytest.fixture
def world(private_stack: PrivateStack, tmp_path: Path) -> Iterator[World]:
    # A private stack whose broker is reached directly: a broker restart behind the order
    # stack's TCP proxy left every consumer's coordinator connection waiting for good.
    prefix = f"rl{uuid.uuid4().hex[:6]}."
    create_topics(private_stack.kafka, [prefix + TRANSFER_EVENTS_TOPIC], partitions=6)
    create_topics(
        private_stack.kafka,
        [prefix + ACCOUNT_COMMANDS_TOPIC, prefix + "saga-dead-letters"],
        partitions=3,
    )
    w = World(private_stack, prefix, tmp_path)
    try:
        yield w
    finally:
        for p in w.procs:
            p.stop()


def test_every_saga_ends_and_money_is_conserved_across_postgres_and_broker_restarts(
    world: World, request: pytest.FixtureRequest
) -> None:
    stack = world.stack
    service = AccountsService(
        kafka={"bootstrap.servers": stack.kafka},
        database_url=stack.database,
        schema=f"accounts_{world.prefix.rstrip('.')}",
        topic_prefix=world.prefix,
        application_name=f"accounts-{world.prefix}",
    )
    service.open_accounts(ACCOUNTS)
    before = service.total()
    # One replica migrates the schema before the others start.
    replicas = [world.start("r0")]
    wait_until(
        lambda: world.count("SELECT count(*) FROM consumer_offset") >= 0,
        timeout=120,
        what="the first replica's schema",
    )
    replicas += [world.start(f"r{i}") for i in range(1, REPLICAS)]
    # A replica that cannot reach the database while it starts exits (the platform restarts
    # it): every replica runs before the first fault, which comes once r0 alone may have ended
    # 50 sagas.
    wait_until(
        lambda: all(f"processor {p.log_path.stem} started" in p.log() for p in replicas),
        timeout=120,
        what="every replica running",
    )
    stop = threading.Event()
    accounts = threading.Thread(target=service.run, args=(stop,), name="accounts", daemon=True)
    load = Load(stack.kafka, world.prefix + TRANSFER_EVENTS_TOPIC)
    loader = threading.Thread(target=load.run, name="load", daemon=True)
    accounts.start()
    loader.start()
    try:
        wait_until(lambda: world.ended() >= 50, timeout=120, what="50 sagas ended before faults")

        # PostgreSQL goes away for longer than the replicas' unavailable timeout.
        stack.down("postgres")
        down_at = len(load.published)
        wait_until(
            lambda: len(load.published) >= down_at + 11 * RATE,
            timeout=60,
            what="11 s of requests while PostgreSQL is down (the bound is 8 s)",
        )
        stack.up("postgres")
        mark = len(load.published)
        try:
            wait_until(
                lambda: world.ended() >= mark,
                timeout=180,
                what=f"{mark} sagas ended after the PostgreSQL restart",
            )
        except AssertionError as e:
            raise AssertionError(f"{e}\n{world.report(load, service)}") from None
        assert all(p.alive() for p in replicas), "a replica exited after the PostgreSQL restart"

        # The broker restarts with requests, commands and replies in flight.
        stack.down("kafka")
        stack.up("kafka")
        mark = len(load.published)
        wait_until(
            lambda: len(load.published) >= mark + 5 * RATE,
            timeout=60,
            what="requests after the broker restart",
        )
    finally:
        load.stop.set()
        loader.join(120)
    try:
        total = len(load.published)
        assert not load.errors, load.errors[:3]
        try:
            wait_until(
                lambda: world.ended() == total,
                timeout=300,
                what=f"all {total} sagas ended",
            )
        except AssertionError as e:
            raise AssertionError(f"{e}\n{world.report(load, service)}") from None
        wait_until(
            lambda: world.count("SELECT count(*) FROM outbox") == 0,
            timeout=120,
            what="outbox drained",
        )
        wait_until(
            lambda: service.ledger.steps() and len(service.ledger.steps()) == 2 * total,
            timeout=120,
            what="every account step applied",
        )
    finally:
        stop.set()
        accounts.join(60)
    alive = [p.alive() for p in replicas]
    assert all(alive), [p.log()[-3000:] for p, a in zip(replicas, alive, strict=True) if not a]
    assert not accounts.is_alive()

    # Every saga completed (debit then credit), each step applied exactly once: the money
    # moved between accounts and none was made or lost.
    rows = world.db("SELECT saga_id, status, state FROM saga_instance")
    assert len(rows) == total
    for saga_id, status, state in rows:
        assert status == "ended", (saga_id, status)
        assert isinstance(state, dict)
        assert state["debit_confirmed"], (saga_id, state)
        assert state["credit_confirmed"], (saga_id, state)
    steps = service.ledger.steps()
    assert {outcome for _, _, outcome in steps} == {"applied"}
    assert service.total() == before
    for table in ("dead_letter", "parked_message", "failed_outbox"):
        assert world.count(f"SELECT count(*) FROM {table}") == 0, table
    # Clients replaced on the way (see docs/operations.md), for the run's summary.
    logs = {p.log_path.stem: p.log() for p in replicas}
    replaced = {
        name: (log.count("replacing its Kafka client"), log.count("recreating"))
        for name, log in logs.items()
    }
    accounts_replaced = replaced_clients(service.service)
    if load.replaced or accounts_replaced or any(c or r for c, r in replaced.values()):
        notice(
            request,
            f"replaced: load producer {load.replaced}, accounts consumer {accounts_replaced},"
            f" replicas' (consumers, producers) {replaced}",
        )
    service.close()
