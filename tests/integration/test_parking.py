"""A saga whose handler keeps failing is parked with its later messages; a retry replays them.

The saga here packs an order's items through a warehouse dependency. While the warehouse is
broken for an item, that item's handler raises: the saga is parked, everything after it for the
same order waits in `parked_message`, and other orders keep flowing on the same partition. Once
the warehouse works, a retry (from Python, or `python -m processor retry`) replays the held
messages in order and the order completes as if nothing had happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]
from pydantic import Field, SecretStr

from processor import (
    Message,
    SagaCommands,
    SagaContext,
    SagaState,
    message_type,
    saga,
    saga_event_handler,
    saga_function,
)
from processor._bootstrap.adapters import tables_for
from processor._engine.partitioner import partition_for
from processor._postgres.reads.operator import OperatorQueries, open_operator_queries
from processor._runtime.assembly import bind_sagas
from processor.ops._parked import RetryResult, list_parked, retry_parked_saga
from processor.settings import OperatorSettings, ProcessorSettings
from tests.support.harness import (
    Publisher,
    Reader,
    create_topics,
    query,
    running,
    settings_for,
    wait_until,
)
from tests.support.procs import REPO, settings_env

pytestmark = pytest.mark.integration

EVENTS = "parking-test-events"
COMMANDS = "parking-test-commands"
SAGA_TYPE = "parking-test-order"
HELD = "behind a parked saga"


@message_type("tests.parking.OrderPlaced", topic=EVENTS)
class OrderPlaced(Message):
    order_id: str


@message_type("tests.parking.ItemAdded", topic=EVENTS)
class ItemAdded(Message):
    order_id: str
    item: str


@message_type("tests.parking.OrderClosed", topic=EVENTS)
class OrderClosed(Message):
    order_id: str


@message_type("tests.parking.PackItem", topic=COMMANDS)
class PackItem(Message):
    order_id: str
    item: str
    position: int


class Warehouse:
    """The dependency the handlers call; it refuses the items (or orders) listed in `broken`."""

    def __init__(self, *broken: str) -> None:
        self.broken = set(broken)

    def accept(self, item: str) -> None:
        if item in self.broken:
            raise RuntimeError(f"warehouse cannot take {item}")


# What a process gets when nobody registers a warehouse: a working one. The CLI retry runs in
# its own process, the way an operator runs it after the fix has been deployed.
WORKING_WAREHOUSE = Warehouse()


@saga(type=SAGA_TYPE)
class PackingSaga(SagaState):
    """Packs each added item in order, and ends when the order is closed."""

    order_id: str = ""
    items: list[str] = Field(default_factory=list)

    @saga_event_handler(OrderPlaced, association_property="order_id", start=True)
    def placed(self, event: OrderPlaced, warehouse: Warehouse = WORKING_WAREHOUSE) -> None:
        warehouse.accept(event.order_id)
        self.order_id = event.order_id

    @saga_event_handler(ItemAdded, association_property="order_id")
    def added(
        self,
        event: ItemAdded,
        commands: SagaCommands,
        warehouse: Warehouse = WORKING_WAREHOUSE,
    ) -> None:
        warehouse.accept(event.item)
        self.items.append(event.item)
        commands.send(PackItem(order_id=self.order_id, item=event.item, position=len(self.items)))

    @saga_event_handler(OrderClosed, association_property="order_id", end=True)
    def closed(self, event: OrderClosed) -> None:
        """Nothing left to do."""


@dataclass
class Env:
    settings: ProcessorSettings
    pub: Publisher
    packed: Reader

    @property
    def events(self) -> str:
        return self.settings.topic_prefix + EVENTS

    def db(self, sql: str, *args: object) -> list[tuple[object, ...]]:
        url = self.settings.database.url.get_secret_value()
        return query(url, self.settings.database.schema_name, sql, *args)

    def status(self, order: str) -> object:
        rows = self.db("SELECT status FROM saga_instance WHERE saga_id = %s", order)
        return rows[0][0] if rows else None

    def held(self, order: str) -> list[tuple[object, ...]]:
        return self.db(
            'SELECT "offset", reason FROM parked_message WHERE saga_id = %s ORDER BY id', order
        )

    def history(self, order: str) -> list[tuple[object, ...]]:
        return self.db(
            "SELECT outcome, version FROM saga_history WHERE saga_id = %s ORDER BY id", order
        )

    def packed_items(self, order: str) -> list[tuple[str, int]]:
        bodies = [json.loads(m.value()) for m in self.packed.records]
        return [(b["item"], b["position"]) for b in bodies if b["order_id"] == order]


@pytest.fixture
def env(kafka_bootstrap: str, database_url: str, pg_schema: str) -> Iterator[Env]:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    # One partition: the parked order and the healthy one share a log.
    create_topics(
        kafka_bootstrap, [prefix + EVENTS, prefix + COMMANDS, prefix + "saga-dead-letters"]
    )
    settings = settings_for(kafka_bootstrap, database_url, pg_schema, prefix)
    packed = Reader(kafka_bootstrap, [prefix + COMMANDS])
    try:
        yield Env(settings, Publisher(kafka_bootstrap), packed)
    finally:
        packed.close()


def _park_order(env: Env, order: str, healthy: str) -> None:
    """Publishes two orders, one of which hits the broken item; waits until it is parked."""
    for event in (
        OrderPlaced(order_id=order),
        OrderPlaced(order_id=healthy),
        ItemAdded(order_id=order, item="cup"),
        ItemAdded(order_id=order, item="glass"),
        ItemAdded(order_id=healthy, item="glass-free"),
        ItemAdded(order_id=order, item="plate"),
        OrderClosed(order_id=healthy),
    ):
        env.pub.event(env.events, event.order_id, event)
    env.pub.flush()
    wait_until(lambda: env.status(order) == "parked", timeout=90, what="order parked")
    wait_until(lambda: env.status(healthy) == "ended", timeout=90, what="other order ended")
    # Published after the saga was parked: held behind it in a later batch.
    env.pub.event(env.events, order, ItemAdded(order_id=order, item="bowl"))
    env.pub.event(env.events, order, OrderClosed(order_id=order))
    env.pub.flush()
    wait_until(lambda: len(env.held(order)) == 4, timeout=90, what="four held messages")


def _assert_parked(env: Env, order: str) -> None:
    held = env.held(order)
    assert [int(str(o)) for o, _ in held] == sorted(int(str(o)) for o, _ in held)
    assert "RuntimeError: warehouse cannot take glass" in str(held[0][1])
    assert [r for _, r in held[1:]] == [HELD, HELD, HELD]
    reason = env.db("SELECT parked_reason FROM saga_instance WHERE saga_id = %s", order)
    assert "warehouse cannot take glass" in str(reason[0][0])
    assert env.history(order) == [
        ("applied", 1),
        ("applied", 2),
        ("parked", 3),
        ("parked-behind", 4),
        ("parked-behind", 5),
        ("parked-behind", 6),
    ]


def _assert_completed_in_order(env: Env, order: str) -> None:
    assert env.status(order) == "ended"
    assert env.held(order) == []
    history = env.history(order)
    assert [o for o, _ in history[6:]] == ["applied"] * 4
    versions = [v for _, v in history]
    assert versions == list(range(1, len(history) + 1))
    env.packed.wait_for(
        lambda rs: len(env.packed_items(order)) >= 4, timeout=90, what="every item packed"
    )
    assert env.packed_items(order) == [("cup", 1), ("glass", 2), ("plate", 3), ("bowl", 4)]


def test_a_parked_saga_holds_its_messages_and_a_retry_replays_them_in_order(env: Env) -> None:
    order, healthy = f"o-{uuid.uuid4().hex[:6]}", f"h-{uuid.uuid4().hex[:6]}"
    warehouse = Warehouse("glass")
    with running(env.settings, [PackingSaga], dependencies={Warehouse: warehouse}):
        _park_order(env, order, healthy)
        _assert_parked(env, order)
        env.packed.wait_for(lambda rs: env.packed_items(healthy) != [], what="healthy packed")
        with _queries(env) as queries:
            listed = list_parked(queries)
        assert [(p.saga_type, p.saga_id, p.held) for p in listed] == [(SAGA_TYPE, order, 4)]
        assert listed[0].reason is not None
        assert "glass" in listed[0].reason

        # Not fixed yet: the retry fails on the same message and changes nothing.
        again = _retry(env, order, warehouse)
        assert not again.ok
        assert again.failure is not None
        assert again.status == "parked"
        assert "warehouse cannot take glass" in again.failure.reason
        assert again.failure.offset == int(str(env.held(order)[0][0]))
        _assert_parked(env, order)

        warehouse.broken.clear()
        result = _retry(env, order, warehouse)
        assert result.ok, result.failure
        assert (result.held, result.status) == (4, "ended")
        assert [(o.outcome, o.version) for o in result.outcomes] == [
            ("applied", 7),
            ("applied", 8),
            ("applied", 9),
            ("applied", 10),
        ]
        _assert_completed_in_order(env, order)
        # The running processor's relay was woken by the retry's commit.
        wait_until(lambda: env.db("SELECT count(*) FROM outbox") == [(0,)], what="outbox drained")
    assert env.packed_items(healthy) == [("glass-free", 1)]


def test_a_saga_whose_start_failed_is_started_by_the_retry(env: Env) -> None:
    order = f"o-{uuid.uuid4().hex[:6]}"
    warehouse = Warehouse(order)
    with running(env.settings, [PackingSaga], dependencies={Warehouse: warehouse}):
        env.pub.event(env.events, order, OrderPlaced(order_id=order))
        env.pub.event(env.events, order, ItemAdded(order_id=order, item="cup"))
        env.pub.flush()
        wait_until(lambda: len(env.held(order)) == 2, timeout=90, what="two held messages")
        # Parked before it ever had state: the row only holds the place of the saga.
        assert env.db("SELECT state, status FROM saga_instance") == [(None, "parked")]
        assert env.history(order) == [("parked", 1), ("parked-behind", 2)]

        warehouse.broken.clear()
        result = _retry(env, order, warehouse)
        assert result.ok, result.failure
        assert [(o.outcome, o.version) for o in result.outcomes] == [("applied", 3), ("applied", 4)]
        state = env.db("SELECT state, status, version FROM saga_instance WHERE saga_id = %s", order)
        assert state == [({"order_id": order, "items": ["cup"]}, "active", 4)]
        env.packed.wait_for(lambda rs: env.packed_items(order) != [], what="cup packed")
        assert env.packed_items(order) == [("cup", 1)]


def _queries(env: Env) -> OperatorQueries:
    return open_operator_queries(
        env.settings.database.url.get_secret_value(), tables_for(env.settings)
    )


def _retry(env: Env, order: str, warehouse: Warehouse) -> RetryResult:
    """Retries as the `retry` command does, with the test's saga and warehouse bound in."""
    bound = bind_sagas(env.settings, [PackingSaga], dependencies={Warehouse: warehouse})
    with _queries(env) as queries:
        return retry_parked_saga(
            queries,
            bound.planner,
            SAGA_TYPE,
            order,
            registry=bound.registry,
            max_record_bytes=env.settings.consumer.max_record_bytes,
        )


def _cli(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        **settings_env(env.settings),
        # The child imports this module to find the saga (and its message types).
        "SAGA_SAGAS": json.dumps(["tests.integration.test_parking:PackingSaga"]),
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run(
        [sys.executable, "-m", "processor", *args],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_an_operator_lists_and_retries_a_parked_saga_from_the_command_line(env: Env) -> None:
    order, healthy = f"o-{uuid.uuid4().hex[:6]}", f"h-{uuid.uuid4().hex[:6]}"
    with running(env.settings, [PackingSaga], dependencies={Warehouse: Warehouse("glass")}):
        _park_order(env, order, healthy)
        listing = _cli(env, "parked")
        assert listing.returncode == 0, listing.stderr
        [line] = [ln for ln in listing.stdout.splitlines() if order in ln]
        assert line.split()[:3] == [SAGA_TYPE, order, "4"]
        assert "warehouse cannot take glass" in line

        # The child process has no broken warehouse registered: the fix is deployed there.
        retried = _cli(env, "retry", SAGA_TYPE, order, "--json")
        assert retried.returncode == 0, retried.stderr
        result = json.loads(retried.stdout)
        assert (result["saga_id"], result["status"], result["failure"]) == (order, "ended", None)
        _assert_completed_in_order(env, order)

        missing = _cli(env, "retry", SAGA_TYPE, order)
        assert missing.returncode == 1
        assert "not parked" in missing.stderr
        assert _cli(env, "parked").stdout.strip() == "no parked sagas"


@pytest.mark.slow
def test_parked_retry_is_an_operator_record_the_running_processor_applies(env: Env) -> None:
    order, healthy = f"o-{uuid.uuid4().hex[:6]}", f"h-{uuid.uuid4().hex[:6]}"
    operator = OperatorSettings(key=SecretStr("operator-key"), name="ops")
    env = Env(env.settings.model_copy(update={"operator": operator}), env.pub, env.packed)
    warehouse = Warehouse("glass")
    with running(env.settings, [PackingSaga], dependencies={Warehouse: warehouse}):
        _park_order(env, order, healthy)
        version = env.db("SELECT version FROM saga_instance WHERE saga_id = %s", order)

        # Not fixed yet: the processor's replay fails again, nothing changes, and it says where.
        again = _cli(env, "parked", "retry", SAGA_TYPE, order, "--reason", "try", "--json")
        assert again.returncode == 1, again.stderr
        refused = json.loads(again.stdout)
        assert refused["outcome"] == "operator-refused"
        assert "warehouse cannot take glass" in refused["detail"]
        assert env.status(order) == "parked"
        assert len(env.held(order)) == 4
        assert env.db("SELECT version FROM saga_instance WHERE saga_id = %s", order) == version

        # The fix is deployed in the running processor: the next request replays in order.
        warehouse.broken.clear()
        done = _cli(env, "parked", "retry", SAGA_TYPE, order, "--reason", "fixed", "--json")
        assert done.returncode == 0, done.stderr
        applied = json.loads(done.stdout)
        assert applied["outcome"] == "applied"
        assert applied["detail"] == "operator parked-retry by ops: fixed"
        assert env.status(order) == "ended"
        assert env.held(order) == []
        env.packed.wait_for(
            lambda rs: len(env.packed_items(order)) >= 4, timeout=90, what="every item packed"
        )
        assert env.packed_items(order) == [("cup", 1), ("glass", 2), ("plate", 3), ("bowl", 4)]
        tail = env.db(
            "SELECT message_type, outcome FROM saga_history WHERE saga_id = %s ORDER BY id", order
        )[-6:]
        assert tail == [
            ("operator:parked-retry", "operator-refused"),
            ("operator:parked-retry", "applied"),
            *[("tests.parking.ItemAdded", "applied")] * 3,
            ("tests.parking.OrderClosed", "applied"),
        ]


@pytest.mark.slow
def test_parked_retry_all_requests_a_replay_of_every_matching_parked_saga(env: Env) -> None:
    orders = [f"o-{uuid.uuid4().hex[:6]}" for _ in range(3)]
    operator = OperatorSettings(key=SecretStr("operator-key"), name="ops")
    env = Env(env.settings.model_copy(update={"operator": operator}), env.pub, env.packed)
    warehouse = Warehouse("glass")
    with running(env.settings, [PackingSaga], dependencies={Warehouse: warehouse}):
        for order in orders:
            _park_order(env, order, f"h-{uuid.uuid4().hex[:6]}")
        warehouse.broken.clear()  # the fix is deployed

        refused = _cli(env, "parked", "retry", "--all")
        assert refused.returncode == 2
        assert "--reason" in refused.stderr
        narrowed = _cli(
            env, "parked", "retry", "--all", "--reason", "x", "--saga-type", "no-such-type"
        )
        assert narrowed.returncode == 0, narrowed.stderr
        assert "0 of 3 parked sagas match" in narrowed.stdout

        done = _cli(
            env,
            "parked",
            "retry",
            "--all",
            "--reason",
            "warehouse fixed",
            "--saga-type",
            SAGA_TYPE,
            "--since",
            "1h",
            "--parked-for",
            "warehouse cannot take glass",
        )
        assert done.returncode == 0, done.stderr
        assert "3 of 3 parked sagas match" in done.stdout
        assert "sent 3 retry request(s), 0 not sent" in done.stdout
        wait_until(
            lambda: all(env.status(o) == "ended" for o in orders),
            timeout=90,
            what="every parked order replayed",
        )
        env.packed.wait_for(
            lambda rs: all(len(env.packed_items(o)) >= 4 for o in orders),
            timeout=90,
            what="every item packed",
        )
    for order in orders:
        assert env.held(order) == []
        assert env.packed_items(order) == [("cup", 1), ("glass", 2), ("plate", 3), ("bowl", 4)]


@pytest.mark.slow
def test_a_saga_parked_before_a_growth_is_retried_after_it_with_its_commands_in_order(
    kafka_bootstrap: str, database_url: str, pg_schema: str
) -> None:
    """Its first records are on the partition it had; those sent after the growth, on its new
    one. Nothing about the replay depends on how long ago the growth was."""
    prefix = f"t{uuid.uuid4().hex[:8]}."
    create_topics(
        kafka_bootstrap,
        [prefix + EVENTS, prefix + COMMANDS, prefix + "saga-dead-letters"],
        partitions=2,
    )
    settings = settings_for(
        kafka_bootstrap,
        database_url,
        pg_schema,
        prefix,
        consumer={"growth_check_interval": "300ms"},
    )
    packed = Reader(kafka_bootstrap, [prefix + COMMANDS])
    env = Env(settings, Publisher(kafka_bootstrap), packed)
    order = next(
        o
        for i in range(100)
        if partition_for((o := f"o-{uuid.uuid4().hex[:6]}").encode(), 4, "crc32") >= 2
    )
    old, new = partition_for(order.encode(), 2, "crc32"), partition_for(order.encode(), 4, "crc32")
    warehouse = Warehouse("glass")
    try:
        with running(settings, [PackingSaga], dependencies={Warehouse: warehouse}) as proc:
            worker = proc.worker
            assert worker is not None
            for event in (
                OrderPlaced(order_id=order),
                ItemAdded(order_id=order, item="cup"),
                ItemAdded(order_id=order, item="glass"),
            ):
                env.pub.event(env.events, order, event)
            env.pub.flush()
            wait_until(lambda: env.status(order) == "parked", timeout=60, what="order parked")

            admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
            for future in admin.create_partitions([NewPartitions(env.events, 4)]).values():
                future.result(30)
            wait_until(lambda: len(worker.epochs) == 4, 60, "the new partitions claimed")
            # A producer that knows the new count sends the rest to the saga's new partition.
            late = Publisher(kafka_bootstrap)
            late.event(env.events, order, ItemAdded(order_id=order, item="plate"))
            late.event(env.events, order, OrderClosed(order_id=order))
            late.flush()
            wait_until(lambda: len(env.held(order)) == 3, timeout=60, what="three held messages")
            partitions = env.db(
                "SELECT partition FROM parked_message WHERE saga_id = %s ORDER BY id", order
            )
            assert partitions == [(old,), (new,), (new,)]

            warehouse.broken.clear()
            result = _retry(env, order, warehouse)
            assert result.ok, result.failure
            assert (result.held, result.status) == (3, "ended")
            env.packed.wait_for(
                lambda rs: len(env.packed_items(order)) >= 3, timeout=60, what="every item packed"
            )
            assert env.packed_items(order) == [("cup", 1), ("glass", 2), ("plate", 3)]
    finally:
        packed.close()


FUNCTION_TYPE = "parking-test-function"


@saga_function(type=FUNCTION_TYPE, association_property="order_id")
async def packing_function(
    saga: SagaContext, placed: OrderPlaced, warehouse: Warehouse = WORKING_WAREHOUSE
) -> None:
    """PackingSaga written as one function: packs each added item in order until closed."""
    warehouse.accept(placed.order_id)
    packed = 0
    while True:
        event = await saga.wait((ItemAdded, OrderClosed))
        if not isinstance(event, ItemAdded):
            return
        warehouse.accept(event.item)
        packed += 1
        saga.send(PackItem(order_id=placed.order_id, item=event.item, position=packed))


def test_a_saga_function_that_raises_is_parked_and_a_retry_replays_it_to_the_end(
    env: Env,
) -> None:
    order, healthy = f"o-{uuid.uuid4().hex[:6]}", f"h-{uuid.uuid4().hex[:6]}"
    warehouse = Warehouse("glass")
    deps: dict[type, object] = {Warehouse: warehouse}
    with running(env.settings, [packing_function], dependencies=deps):
        _park_order(env, order, healthy)
        # The same parking as a handler's: the failing input, then three held behind it; the
        # other order on the same partition went on and ended.
        _assert_parked(env, order)
        env.packed.wait_for(lambda rs: env.packed_items(healthy) != [], what="healthy packed")

        warehouse.broken.clear()
        bound = bind_sagas(env.settings, [packing_function], dependencies=deps)
        with _queries(env) as queries:
            result = retry_parked_saga(
                queries,
                bound.planner,
                FUNCTION_TYPE,
                order,
                registry=bound.registry,
                max_record_bytes=env.settings.consumer.max_record_bytes,
            )
        assert result.ok, result.failure
        assert (result.held, result.status) == (4, "ended")
        # Replayed from its journal: every item packed once, in order, the first ones not again.
        _assert_completed_in_order(env, order)
    assert env.packed_items(healthy) == [("glass-free", 1)]
