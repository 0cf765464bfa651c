"""Relays per owned partition against real Kafka and PostgreSQL.

Two relays owning different input partitions publish at the same time (one holds its claim open
until the other has published everything). A partition handed over while its old owner's claim
is open: the new owner's epoch bump waits for that claim (the old owner's own offset updates do
not), the old owner then claims nothing of it, and each saga's commands reach the command topic
in order. A saga whose rows come from two partitions (its input topic grew) has its commands
published in order by the two owners' relays.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from processor._engine.records import OffsetCommit, OutboxRow
from processor._engine.rows import WriteSet
from processor._errors import LockBusy
from processor._kafka.producer import KafkaRecordProducer, make_producer, relay_overrides
from processor._ports import TP
from processor._postgres.batch.store import BatchSql
from processor._postgres.connect import connect, ensure_schema
from processor._postgres.outbox import PostgresOutboxStore
from processor._postgres.schema.tables import Tables
from processor._runtime.hooks import Hooks
from processor._runtime.relay import Relay
from tests.support.harness import Reader, wait_until

pytestmark = pytest.mark.integration

GROUP = "relay-partitions"
SAGAS = 200


class Env:
    """One schema, a command topic, and relays made on demand (closed at the end)."""

    def __init__(self, kafka: str, database_url: str, tables: Tables, commands: str) -> None:
        self.kafka = kafka
        self.database_url = database_url
        self.tables = tables
        self.commands = commands
        self.relays: list[Relay] = []
        self.insert = tables.render(
            "INSERT INTO {outbox} (saga_type, saga_id, topic, key, headers, value,"
            " source_topic, source_partition) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
        )

    def take_over(self, tps: list[TP], owner: str) -> dict[TP, int]:
        with connect(self.database_url) as conn:
            claimed = BatchSql(conn, self.tables, GROUP).claim(tps, owner)
        return {tp: epoch for tp, (epoch, _) in claimed.items()}

    def relay(self, owned: Callable[[], dict[TP, int]], hooks: Hooks | None = None) -> Relay:
        relay = Relay(
            PostgresOutboxStore(lambda: connect(self.database_url), self.tables, GROUP),
            KafkaRecordProducer(
                lambda: make_producer(
                    {"bootstrap.servers": self.kafka},
                    partitioner="crc32",
                    **relay_overrides(10**6),
                )
            ),
            batch_size=100,
            poll_interval=0.1,
            flush_timeout=20.0,
            hooks=hooks,
            owned=owned,
        )
        self.relays.append(relay)
        return relay

    def add(self, source: TP, sagas: range, n: int, prefix: str | None = None) -> None:
        """Command n of each saga, caused by a record of ``source``.

        The sagas are ``<prefix>-<i>``; without a prefix, each partition has sagas of its own.
        """
        name = prefix if prefix is not None else str(source[1])
        rows = [
            (
                "transfer",
                f"{name}-{i}",
                self.commands,
                f"{name}-{i}".encode(),
                Jsonb({"message-id": f"{name}-{i}-{n}"}),
                b"v",
                *source,
            )
            for i in sagas
        ]
        with connect(self.database_url, autocommit=True) as admin:
            admin.cursor().executemany(self.insert, rows)


@pytest.fixture
def env(
    kafka_bootstrap: str, database_url: str, pg_schema: str, make_topic: Callable[..., str]
) -> Iterator[Env]:
    tables = Tables(schema=pg_schema)
    ensure_schema(database_url, tables)
    e = Env(kafka_bootstrap, database_url, tables, make_topic("commands", partitions=3))
    try:
        yield e
    finally:
        for r in e.relays:
            r.close()


def per_saga(reader: Reader) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    for msg in reader.records:
        seen.setdefault(msg.key().decode(), []).append(reader.headers(msg)["message-id"])
    return seen


def in_order(ids: list[str]) -> bool:
    """Each saga's commands in order; a command repeated (same message id) is allowed."""
    numbers = [int(m.rsplit("-", 1)[1]) for m in ids]
    return all(a <= b for a, b in itertools.pairwise(numbers))


def run_in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # surfaced by the test
            out.append(e)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, out


def test_relays_of_different_partitions_publish_at_the_same_time(env: Env) -> None:
    t0, t1 = ("events", 0), ("events", 1)
    e0 = env.take_over([t0], "one")
    e1 = env.take_over([t1], "two")
    for n in (1, 2):
        env.add(t0, range(SAGAS), n)
        env.add(t1, range(SAGAS), n)
    release = threading.Event()
    hooks = Hooks()

    # Relay one keeps its first claim open until relay two has published all of its rows:
    # with one relay at a time across replicas, relay two would get nothing meanwhile.
    def hold() -> None:
        release.wait(60)

    hooks.on("after-produce", hold)
    one = env.relay(lambda: e0, hooks)
    two = env.relay(lambda: e1)

    first, out = run_in_thread(one.run_once)

    def two_done() -> bool:
        two.run_once()
        return two.published >= 2 * SAGAS

    wait_until(two_done, what="relay two publishing while relay one's claim is open")
    assert first.is_alive()
    assert one.published == 0
    release.set()
    first.join(60)
    assert out == [100]
    while one.run_once():
        pass
    assert one.published == 2 * SAGAS

    reader = Reader(env.kafka, [env.commands])
    try:
        reader.wait_for(lambda rs: len(rs) >= 4 * SAGAS, what="every command")
        seen = per_saga(reader)
        assert len(seen) == 2 * SAGAS
        assert all(ids == [f"{saga}-1", f"{saga}-2"] for saga, ids in seen.items())
    finally:
        reader.close()


def held_after_produce() -> tuple[threading.Event, threading.Event, Hooks]:
    """Hooks that hold a relay round after its produce, inside its claim, until released:
    (set once held, set to release, the hooks)."""
    in_claim, release = threading.Event(), threading.Event()
    hooks = Hooks()

    def hold() -> None:
        in_claim.set()
        release.wait(60)

    hooks.on("after-produce", hold)
    return in_claim, release, hooks


def test_a_claim_that_waits_past_its_bound_names_who_holds_the_rows(env: Env) -> None:
    tp = ("events", 0)
    old = env.take_over([tp], "one")
    env.add(tp, range(SAGAS), 1)
    in_claim, release, hooks = held_after_produce()
    relay = env.relay(lambda: old, hooks)
    first, _ = run_in_thread(relay.run_once)
    try:
        assert in_claim.wait(30)
        with pytest.raises(LockBusy) as busy:
            env.take_over([tp], "two")
    finally:
        release.set()
        first.join(60)
    # The relay's session, in its transaction, is named: a frozen process tells itself apart
    # from a slow flush by what it waits on and for how long.
    message = str(busy.value)
    assert "rows busy (55P03)" in message
    assert "held by pid" in message
    assert "s in its transaction" in message


def test_a_handed_over_partition_waits_for_the_old_owners_claim(env: Env) -> None:
    tp = ("events", 0)
    old = env.take_over([tp], "one")
    env.add(tp, range(SAGAS), 1)
    env.add(tp, range(SAGAS), 2)
    in_claim, release, hooks = held_after_produce()
    owner_one = env.relay(lambda: old, hooks)
    first, out = run_in_thread(owner_one.run_once)
    assert in_claim.wait(30)

    # The old owner's offset compare-and-set is not blocked by its relay's claim.
    with psycopg.connect(env.database_url) as conn:
        conn.execute("SET lock_timeout = '5s'")
        BatchSql(conn, env.tables, GROUP).write(
            WriteSet(), [OffsetCommit(tp[0], tp[1], 10, None, old[tp])]
        )
        conn.commit()

    bump, bumped = run_in_thread(lambda: env.take_over([tp], "two"))
    bump.join(1.0)
    assert bump.is_alive(), "the new owner's epoch bump did not wait for the claim in flight"
    # Rows the new owner will write once it owns the partition: later commands of each saga.
    release.set()
    first.join(60)
    assert out == [100]
    bump.join(30)
    assert not bump.is_alive()
    new = bumped[0]
    assert new[tp] == old[tp] + 1
    env.add(tp, range(SAGAS), 3)

    # The old owner claims nothing of it any more; the new owner publishes the rest.
    assert owner_one.run_once() == 0
    owner_two = env.relay(lambda: new)
    while owner_two.run_once():
        pass
    assert owner_one.run_once() == 0
    assert owner_one.published == 100
    assert owner_two.published == 3 * SAGAS - 100

    reader = Reader(env.kafka, [env.commands])
    try:
        reader.wait_for(lambda rs: len(rs) >= 3 * SAGAS, what="every command")
        seen = per_saga(reader)
        assert len(seen) == SAGAS
        for saga, ids in seen.items():
            assert in_order(ids), (saga, ids)
            assert sorted(set(ids)) == [f"{saga}-1", f"{saga}-2", f"{saga}-3"]
    finally:
        reader.close()


def test_a_sagas_commands_from_two_partitions_reach_the_topic_in_order(env: Env) -> None:
    # After its input topic grew, a saga's records come from its new partition; a saga parked
    # before the growth and retried after it writes under its old one again. Two replicas own
    # the two partitions, and their relays run at the same time.
    old, new = ("events", 1), ("events", 7)
    epochs = {**env.take_over([old], "one"), **env.take_over([new], "two")}
    sources = (old, new, old, new)
    for n, source in enumerate(sources, start=1):
        env.add(source, range(SAGAS), n, prefix="s")
    one = env.relay(lambda: {old: epochs[old]})
    two = env.relay(lambda: {new: epochs[new]})

    def publish(relay: Relay) -> None:
        deadline = time.monotonic() + 60
        while one.published + two.published < len(sources) * SAGAS:
            assert time.monotonic() < deadline, "the relays stopped publishing"
            if not relay.run_once():
                time.sleep(0.01)

    runs = [run_in_thread(functools.partial(publish, r)) for r in (one, two)]
    for thread, out in runs:
        thread.join(90)
        assert out == [None]
    assert one.published == two.published == 2 * SAGAS

    reader = Reader(env.kafka, [env.commands])
    try:
        reader.wait_for(lambda rs: len(rs) >= len(sources) * SAGAS, what="every command")
        seen = per_saga(reader)
        assert len(seen) == SAGAS
        for saga, ids in seen.items():
            assert ids == [f"{saga}-{n}" for n in range(1, len(sources) + 1)], (saga, ids)
    finally:
        reader.close()


def test_the_batch_store_writes_each_rows_source_partition(env: Env) -> None:
    rows = [
        OutboxRow("transfer", "s1", env.commands, b"s1", {"message-id": "a"}, b"v", None, ("e", 3)),
        OutboxRow(None, None, "dead", None, {"message-id": "b"}, b"v", None, ("e", 4)),
        OutboxRow(None, None, "other", None, {"message-id": "c"}, b"v"),
    ]
    with psycopg.connect(env.database_url) as conn:
        BatchSql(conn, env.tables, GROUP).write(WriteSet(outbox=rows), [])
        conn.commit()
        stored = conn.execute(
            env.tables.render("SELECT source_topic, source_partition FROM {outbox} ORDER BY id")
        ).fetchall()
    assert stored == [("e", 3), ("e", 4), (None, None)]
