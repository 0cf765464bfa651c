"""Retention against a real PostgreSQL, with short periods, written through the engine.

Batches go through the planner and the PostgreSQL batch store as the consumer writes them; the
retention loop's store purges beside them. Purged sagas stay ended (tombstones), applied ids of
running sagas stay duplicates, and the tables stay bounded while tens of thousands of sagas run.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta
from decimal import Decimal

import pytest

from processor import Message, SagaState, message_type, saga, saga_event_handler
from processor._authoring.messages import MessageRegistry
from processor._engine.decode import decode
from processor._engine.plan import Planner
from processor._engine.records import OffsetCommit, Record
from processor._engine.rows import WriteSet
from processor._invocation import bind_all
from processor._ports import Purge
from processor._postgres.batch.handle import PostgresBatchStore
from processor._postgres.connect import connect, ensure_schema
from processor._postgres.retention import PostgresRetentionStore
from processor._postgres.schema.tables import Tables
from processor._runtime.hooks import HookPoint, Hooks
from processor._runtime.retention import Retention
from processor.settings import RetentionSettings
from sagas.transfer import TransferSaga
from schemas.transfers import (
    ACCOUNT_COMMANDS_TOPIC,
    TRANSFER_EVENTS_TOPIC,
    CreditConfirmed,
    DebitConfirmed,
    TransferRequested,
)
from tests.support.harness import (
    Publisher,
    Reader,
    create_topics,
    query,
    running,
    settings_for,
    wait_until,
)
from tests.support.roles import LeastPrivilege

pytestmark = pytest.mark.integration

REG = MessageRegistry()
SAGA = "retention-order"
TOPIC = "retention-in"


@message_type("retention.Opened", registry=REG)
class Opened(Message):
    order_id: str


@message_type("retention.Noted", registry=REG)
class Noted(Message):
    order_id: str


@message_type("retention.Closed", registry=REG)
class Closed(Message):
    order_id: str


@saga(type=SAGA)
class Order(SagaState):
    order_id: str = ""
    notes: int = 0

    @saga_event_handler(Opened, association_property="order_id", start=True)
    def opened(self, event: Opened) -> None:
        self.order_id = event.order_id

    @saga_event_handler(Noted, association_property="order_id")
    def noted(self, event: Noted) -> None:
        self.notes += 1

    @saga_event_handler(Closed, association_property="order_id", end=True)
    def closed(self, event: Closed) -> None:
        """Ends the saga."""


class Engine:
    """Plans and writes batches on one partition, as the consumer does."""

    def __init__(self, url: str, tables: Tables) -> None:
        self.planner = Planner(
            bind_all([Order], registry=REG), registry=REG, dead_letter_topic="dl"
        )
        self.store = PostgresBatchStore(lambda: connect(url), tables, "retention-group")
        self.epoch = self.store.claim([(TOPIC, 0)], "test")[(TOPIC, 0)][0]
        self.next: int | None = None
        self.offset = 0

    def record(self, message: Opened | Noted | Closed, message_id: str) -> Record:
        headers = (
            ("message-id", message_id.encode()),
            ("message-type", REG.of(type(message)).name.encode()),
            ("schema-version", b"1"),
        )
        value = message.model_dump_json().encode()
        r = Record(TOPIC, 0, self.offset, message.order_id.encode(), value, headers)
        self.offset += 1
        return r

    def run(self, records: Sequence[Record]) -> WriteSet:
        items, wants = self.planner.route(decode(r, REG, 1 << 20) for r in records)
        loaded = self.store.load(wants)
        ws = self.planner.plan(items, loaded, loaded.now)
        nxt = records[-1].offset + 1
        self.store.write(ws, [OffsetCommit(TOPIC, 0, nxt, self.next, self.epoch)])
        self.next = nxt
        return ws

    def close(self) -> None:
        self.store.close()


@pytest.fixture
def tables(database_url: str, pg_schema: str) -> Tables:
    t = Tables(schema=pg_schema)
    ensure_schema(database_url, t)
    return t


@pytest.fixture
def engine(database_url: str, tables: Tables) -> Iterator[Engine]:
    e = Engine(database_url, tables)
    yield e
    e.close()


def count(url: str, tables: Tables, table: str, where: str = "true") -> int:
    with connect(url, autocommit=True) as conn:
        row = conn.execute(
            tables.render(f"SELECT count(*) FROM {{{table}}} WHERE {where}")
        ).fetchone()
        assert row is not None
        return int(row[0])


def test_purged_sagas_stay_ended_and_purged_ids_stay_duplicates(
    database_url: str, tables: Tables, engine: Engine
) -> None:
    e = engine
    done_start = e.record(Opened(order_id="done"), "done-1")
    done_note = e.record(Noted(order_id="done"), "done-2")
    live_start = e.record(Opened(order_id="live"), "live-1")
    live_note = e.record(Noted(order_id="live"), "live-2")
    e.run([done_start, done_note, live_start, live_note])
    e.run([e.record(Closed(order_id="done"), "done-3"), e.record(Noted(order_id="live"), "live-2")])
    assert count(database_url, tables, "history", "outcome = 'duplicate'") == 1

    # Ended sagas and non-applied history go at once; ids and tombstones stay for an hour.
    settings = RetentionSettings(
        ended_sagas=0, history=0, dedupe_window=3600, chunk_size=1, chunk_pause=0
    )
    retention = Retention(PostgresRetentionStore(lambda: connect(database_url), tables), settings)
    try:
        done = retention.round()
    finally:
        retention.store.close()
    assert done is not None
    assert done[Purge.ENDED_SAGAS] == 1
    # The running saga's duplicate row is its audit trail: kept however old.
    assert done[Purge.HISTORY] == 0
    assert count(database_url, tables, "instance") == 1
    assert count(database_url, tables, "history", "saga_id = 'done'") == 0
    assert count(database_url, tables, "history", "outcome <> 'applied'") == 1
    assert count(database_url, tables, "tombstone", "saga_id = 'done'") == 1

    # Redelivered: the purged saga's start event and one of its purged ids, and an applied id
    # of the running saga (none of its history was purged).
    ws = e.run([done_start, done_note, live_note])

    assert [(h.saga_id, h.outcome) for h in ws.history] == [
        ("done", "ignored-ended"),
        ("done", "ignored-ended"),
        ("live", "duplicate"),
    ]
    assert ws.sagas == []
    assert ws.outbox == []
    assert count(database_url, tables, "instance") == 1
    assert count(database_url, tables, "instance", "saga_id = 'live' AND version = 2") == 1


def test_tables_stay_bounded_while_fifty_thousand_sagas_start_and_end(
    database_url: str, tables: Tables, engine: Engine
) -> None:
    # Ten blocks of 5,000 sagas, each started and ended in batches of 500 while the loop purges
    # beside them. Whether the loop keeps up with a given write rate is a matter of speed, which
    # S6 (the soak benchmark) measures; what is asserted here holds on any machine: after each
    # block, the first round that starts once the block's rows are past their periods leaves
    # none of them, so no table ever holds more than one block, against 50,000 sagas and
    # 100,000 history rows without retention.
    total, block, per_batch = 50_000, 5_000, 500
    settings = RetentionSettings(
        ended_sagas=0.2,
        history=0.2,
        dedupe_window=0.5,
        dead_letters=1.0,
        parked_messages=1.0,
        failed_outbox=1.0,
        chunk_size=2000,
        chunk_pause=0,
        interval=0.05,
    )
    longest = settings.dedupe_window.total_seconds()
    hooks = Hooks()
    starts: list[float] = []
    hooks.on(HookPoint.RETENTION_ROUND, lambda: starts.append(time.time()))
    retention = Retention(
        PostgresRetentionStore(lambda: connect(database_url), tables), settings, hooks=hooks
    )

    def purged_since(moment: float) -> bool:
        # Rounds complete in the order they start; a round that failed leaves an extra start
        # in the list, which only makes this stricter.
        done = retention.rounds
        return done > 0 and starts[done - 1] > moment

    stop = threading.Event()
    loop = threading.Thread(target=retention.run, args=(stop,), name="retention")
    loop.start()
    peaks = {"instance": 0, "history": 0, "tombstone": 0}
    try:
        for first in range(0, total, block):
            for start in range(first, first + block, per_batch):
                ids = [f"s{n}" for n in range(start, start + per_batch)]
                records = [engine.record(Opened(order_id=i), f"{i}-o") for i in ids]
                records += [engine.record(Closed(order_id=i), f"{i}-c") for i in ids]
                ws = engine.run(records)
                assert ws.counts["ended"] == per_batch
            # Every saga of the block ended (in the database's clock, the same as this one's)
            # before this moment.
            written = time.time()
            for table, peak in list(peaks.items()):
                peaks[table] = max(peak, count(database_url, tables, table))
            wait_until(
                functools.partial(purged_since, written + longest),
                timeout=30,
                what=f"a retention round after sagas s{first}..s{first + block - 1} aged",
            )
            left = {table: count(database_url, tables, table) for table in peaks}
            assert left == {"instance": 0, "history": 0, "tombstone": 0}, (first, left)
    finally:
        stop.set()
        loop.join(10)
    assert not loop.is_alive()
    assert retention.deleted[Purge.ENDED_SAGAS] == total
    assert retention.deleted[Purge.TOMBSTONES] == total
    assert peaks["instance"] <= block, peaks
    assert peaks["history"] <= 2 * block, peaks
    assert peaks["tombstone"] <= block, peaks
    print(f"\npeak rows while {total} sagas ran: {peaks}; deleted {dict(retention.deleted)}")


def test_a_processor_purges_as_its_runtime_role_and_ignores_a_redelivered_start(
    kafka_bootstrap: str, least_privilege_db: LeastPrivilege
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    events, commands_topic = prefix + TRANSFER_EVENTS_TOPIC, prefix + ACCOUNT_COMMANDS_TOPIC
    create_topics(kafka_bootstrap, [events, commands_topic, prefix + "saga-dead-letters"])
    url, schema = least_privilege_db.runtime_url, least_privilege_db.schema
    settings = settings_for(
        kafka_bootstrap,
        url,
        schema,
        prefix,
        deadline={"schema": {"auto": False}},
        retention={
            "ended_sagas": "0s",
            # History of live sagas stays, so the row the redelivery leaves is there to read;
            # the ended saga's own history goes with it.
            "history": "1h",
            "dedupe_window": "1h",
            "interval": "200ms",
        },
    )
    commands = Reader(kafka_bootstrap, [commands_topic])
    pub = Publisher(kafka_bootstrap)
    tid = f"tr-{uuid.uuid4().hex[:6]}"
    amount = Decimal("10.00")
    start = TransferRequested(
        transfer_id=tid, source_account_id="A", target_account_id="B", amount=amount
    )

    def rows(sql: str) -> list[tuple[object, ...]]:
        return query(url, schema, sql)

    try:
        with running(settings, [TransferSaga]) as proc:
            assert proc.health().get("retention") is True
            pub.event(events, tid, start, message_id="start-1")
            pub.flush()
            commands.wait_for(lambda rs: len(rs) >= 1, what="DebitAccount")
            pub.event(events, tid, DebitConfirmed(transfer_id=tid, account_id="A", amount=amount))
            pub.event(events, tid, CreditConfirmed(transfer_id=tid, account_id="B", amount=amount))
            pub.flush()
            commands.wait_for(lambda rs: len(rs) >= 2, what="CreditAccount")
            wait_until(
                lambda: rows("SELECT saga_id FROM saga_tombstone") == [(tid,)],
                what="the ended saga purged to a tombstone",
            )
            assert rows("SELECT count(*) FROM saga_instance") == [(0,)]
            assert rows("SELECT count(*) FROM saga_history") == [(0,)]

            pub.event(events, tid, start, message_id="start-1")  # redelivered
            pub.flush()
            wait_until(
                lambda: (
                    rows("SELECT outcome, detail FROM saga_history")
                    == [("ignored-ended", "ended; purged by retention")]
                ),
                what="the redelivered start recorded as ignored",
            )
            assert rows("SELECT count(*) FROM saga_instance") == [(0,)]
        types = [commands.headers(m)["message-type"] for m in commands.records]
        assert types == ["transfers.DebitAccount", "transfers.CreditAccount"]
    finally:
        commands.close()


class Counting:
    """The PostgreSQL retention store, recording what each statement deleted."""

    def __init__(self, store: PostgresRetentionStore) -> None:
        self.store = store
        self.calls: list[tuple[Purge, int | None]] = []

    def purge(self, what: Purge, older_than: timedelta, limit: int) -> int | None:
        n = self.store.purge(what, older_than, limit)
        self.calls.append((what, n))
        return n

    def close(self) -> None:
        self.store.close()


LONG_HISTORY = 100_000


def test_retention_keeps_unhandled_work_and_live_sagas_and_purges_a_long_history_in_chunks(
    database_url: str, tables: Tables
) -> None:
    with connect(database_url, autocommit=True) as conn:
        for sql in (
            # A saga running for 100 days, with its history as old.
            """INSERT INTO {instance} (saga_type, saga_id, state, status, version, created_at)
               VALUES ('t', 'live', '{{}}', 'active', 3, now() - interval '100 days'),
                      ('t', 'parked', '{{}}', 'parked', 2, now() - interval '100 days')""",
            """INSERT INTO {history} (saga_type, saga_id, message_id, message_type, kind,
                                      outcome, at)
               SELECT 't', s, s || '-' || g, 'm', 'event', o, now() - interval '100 days'
                 FROM unnest(ARRAY['live', 'parked']) AS s,
                      generate_series(1, 3) AS g,
                      unnest(ARRAY['applied', 'duplicate']) AS o""",
            # Unhandled work, recorded 100 days ago.
            """INSERT INTO {dead_letter} (topic, partition, "offset", key, value, headers, reason,
                                          created_at)
               SELECT 'in', 0, g, 'k', 'v', '{{}}', 'invalid-text', now() - interval '100 days'
                 FROM generate_series(1, 5) AS g""",
            """INSERT INTO {failed_outbox} (id, saga_type, saga_id, topic, headers, value,
                                            created_at, reason, attempts, failed_at)
               SELECT g, 't', 'live', 'out', '{{}}', 'v', now() - interval '100 days',
                      'refused', 10, now() - interval '100 days'
                 FROM generate_series(1, 5) AS g""",
            # A saga that ended 40 days ago (past the ended-saga period, within the dedupe
            # window that keeps its tombstone), with a very long history.
            """INSERT INTO {instance} (saga_type, saga_id, state, status, version, ended_at)
               VALUES ('t', 'long', '{{}}', 'ended', 9, now() - interval '40 days')""",
            f"""INSERT INTO {{history}} (saga_type, saga_id, message_id, message_type, kind,
                                       outcome, at)
               SELECT 't', 'long', 'm-' || g, 'm', 'event', 'applied',
                      now() - interval '40 days'
                 FROM generate_series(1, {LONG_HISTORY}) AS g""",
        ):
            conn.execute(tables.render(sql))
    store = Counting(PostgresRetentionStore(lambda: connect(database_url), tables))
    retention = Retention(store, RetentionSettings(chunk_pause=0))  # shipped periods and chunks
    try:
        done = retention.round()
    finally:
        store.close()
    assert done is not None
    for table, live in (("dead_letter", 5), ("failed_outbox", 5), ("instance", 2)):
        assert count(database_url, tables, table) == live, table
    assert count(database_url, tables, "history", "saga_id IN ('live', 'parked')") == 12
    # The long history went in statements of at most a chunk, then the saga.
    assert count(database_url, tables, "history", "saga_id = 'long'") == 0
    assert count(database_url, tables, "tombstone", "saga_id = 'long'") == 1
    chunk = RetentionSettings().chunk_size
    history = [n for what, n in store.calls if what is Purge.ENDED_HISTORY]
    assert sum(n or 0 for n in history) == LONG_HISTORY
    assert max(n or 0 for n in history) <= chunk
    assert len(history) > LONG_HISTORY // chunk
    assert done[Purge.ENDED_SAGAS] == 1
