"""Durable deadlines through real Kafka and PostgreSQL: timeouts, cancels, races, precision, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from pydantic import BaseModel

from processor import (
    Message,
    SagaCommands,
    SagaDeadlines,
    SagaState,
    message_type,
    saga,
    saga_deadline_handler,
    saga_event_handler,
)
from processor._bootstrap.adapters import tables_for
from processor._kafka.producer import KafkaRecordProducer, make_producer
from processor._postgres.connect import connect, ensure_schema
from processor._postgres.deadlines import PostgresDeadlineStore
from processor._postgres.reads.operator import OperatorQueries
from processor._runtime.poller import DeadlinePoller
from processor.ops._deadlines import overdue_deadlines, pending_deadlines
from sagas.transfer import TransferSaga
from schemas.transfers import (
    ACCOUNT_COMMANDS_TOPIC,
    TRANSFER_EVENTS_TOPIC,
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
from tests.support.procs import REPO, settings_env

pytestmark = pytest.mark.integration

PROBE_EVENTS = "deadline-probe-events"
PROBE_COMMANDS = "deadline-probe-commands"


# -- a test-local saga that schedules and cancels whatever its events say -------------------------


class Reminder(BaseModel):
    """A deadline payload with types JSON does not carry on its own."""

    text: str
    amount: Decimal
    noted_at: datetime


class Plan(BaseModel):
    name: str
    after_s: float | None = None
    at: datetime | None = None
    reminder: Reminder | None = None


@message_type("test.deadline-probe.Instructed", topic=PROBE_EVENTS)
class Instructed(Message):
    probe_id: str
    schedule: list[Plan] = []  # noqa: RUF012  (pydantic copies field defaults)
    cancel: list[str] = []  # noqa: RUF012


@message_type("test.deadline-probe.Fired", topic=PROBE_COMMANDS)
class Fired(Message):
    probe_id: str
    name: str
    text: str | None = None
    amount: Decimal | None = None
    noted_at: datetime | None = None
    payload_type: str | None = None


@saga(type="deadline-probe")
class Probe(SagaState):
    probe_id: str = ""

    @saga_event_handler(Instructed, association_property="probe_id", start=True)
    def instructed(self, event: Instructed, deadlines: SagaDeadlines) -> None:
        self.probe_id = event.probe_id
        for name in event.cancel:
            deadlines.cancel(name)
        for plan in event.schedule:
            if plan.at is not None:
                deadlines.schedule(plan.name, at=plan.at, payload=plan.reminder)
            else:
                assert plan.after_s is not None
                deadlines.schedule(plan.name, timedelta(seconds=plan.after_s), plan.reminder)

    @saga_deadline_handler("ping")
    def on_ping(self, commands: SagaCommands) -> None:
        commands.send(Fired(probe_id=self.probe_id, name="ping"))

    @saga_deadline_handler("reminder")
    def on_reminder(self, reminder: Reminder, commands: SagaCommands) -> None:
        commands.send(
            Fired(
                probe_id=self.probe_id,
                name="reminder",
                text=reminder.text,
                amount=reminder.amount,
                noted_at=reminder.noted_at,
                payload_type=type(reminder).__name__,
            )
        )


# -- fixtures and helpers -----------------------------------------------------------------------


@pytest.fixture
def env(kafka_bootstrap: str, database_url: str, pg_schema: str) -> Iterator[dict[str, str]]:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    names = [TRANSFER_EVENTS_TOPIC, ACCOUNT_COMMANDS_TOPIC, PROBE_EVENTS, PROBE_COMMANDS]
    topics = [prefix + t for t in [*names, "saga-dead-letters"]]
    create_topics(kafka_bootstrap, topics, partitions=3)
    yield {"kafka": kafka_bootstrap, "db": database_url, "schema": pg_schema, "prefix": prefix}
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_topics(topics, operation_timeout=30).values():
        future.result()


def _sql(env: dict[str, str], text: str, *args: Any) -> list[tuple[Any, ...]]:
    return query(env["db"], env["schema"], text, *args)


def _db_now(env: dict[str, str]) -> datetime:
    value: datetime = _sql(env, "SELECT now()")[0][0]
    return value


def _requested(tid: str) -> TransferRequested:
    return TransferRequested(
        transfer_id=tid, source_account_id="A", target_account_id="B", amount=Decimal("10.00")
    )


def _confirmed(tid: str) -> DebitConfirmed:
    return DebitConfirmed(transfer_id=tid, account_id="A", amount=Decimal("10.00"))


def _of(reader: Reader, saga_id: str, message_type: str) -> list[Any]:
    return [
        m
        for m in reader.records
        if reader.headers(m).get("saga-id") == saga_id
        and reader.headers(m).get("message-type") == message_type
    ]


def _history(env: dict[str, str], saga_id: str) -> list[tuple[str, str]]:
    rows = _sql(
        env, "SELECT kind, outcome FROM saga_history WHERE saga_id = %s ORDER BY id", saga_id
    )
    return [(k, o) for k, o in rows]


REVERSE = "transfers.ReverseDebit"
CREDIT = "transfers.CreditAccount"
FIRED = "test.deadline-probe.Fired"


# -- the transfer saga's payment timeout --------------------------------------------------------


def test_timeout_compensates_and_a_confirmation_in_time_cancels(env: dict[str, str]) -> None:
    timeout = 4
    settings = settings_for(
        env["kafka"],
        env["db"],
        env["schema"],
        env["prefix"],
        settings={"transfer.payment-timeout": timeout},
    )
    commands = Reader(env["kafka"], [env["prefix"] + ACCOUNT_COMMANDS_TOPIC])
    pub = Publisher(env["kafka"])
    events = env["prefix"] + TRANSFER_EVENTS_TOPIC
    late, on_time = f"late-{uuid.uuid4().hex[:6]}", f"ontime-{uuid.uuid4().hex[:6]}"
    try:
        with running(settings, [TransferSaga]):
            # The confirmation sits right behind the request in the saga's partition, so it is
            # handled long before the timeout is due however loaded the machine is.
            pub.event(events, on_time, _requested(on_time))
            pub.event(events, on_time, _confirmed(on_time))
            pub.event(events, late, _requested(late))
            pub.flush()
            commands.wait_for(lambda _: bool(_of(commands, late, REVERSE)), what="ReverseDebit")
            wait_until(
                lambda: (
                    _sql(env, "SELECT status FROM saga_instance WHERE saga_id = %s", late)
                    == [("ended",)]
                ),
                what="timed-out saga ended",
            )
            started = _sql(env, "SELECT created_at FROM saga_instance WHERE saga_id = %s", on_time)[
                0
            ][0]
            # Past the confirmed saga's due time plus a few sweeps: had it fired, we'd see it.
            wait_until(
                lambda: _db_now(env) > started + timedelta(seconds=timeout + 3),
                what="the confirmed saga's due time to pass",
            )
            commands.wait_for(lambda _: bool(_of(commands, on_time, CREDIT)), what="CreditAccount")
            commands.poll(1.0)
        assert len(_of(commands, late, REVERSE)) == 1
        assert _of(commands, on_time, REVERSE) == []
        assert _of(commands, late, CREDIT) == []
        assert _sql(env, "SELECT count(*) FROM saga_deadline") == [(0,)]
        assert _history(env, late) == [("event", "applied"), ("deadline", "applied")]
        assert _history(env, on_time) == [("event", "applied"), ("event", "applied")]
        assert _sql(env, "SELECT status FROM saga_instance WHERE saga_id = %s", on_time) == [
            ("active",)
        ]
    finally:
        commands.close()


def test_reply_and_timeout_race_in_partition_order_both_ways(env: dict[str, str]) -> None:
    """Whichever of the reply and the fired deadline is first in the partition wins."""
    settings = settings_for(
        env["kafka"],
        env["db"],
        env["schema"],
        env["prefix"],
        settings={"transfer.payment-timeout": 1},
        # The test holds the lease and sweeps by hand, so it decides what is in the log when.
        deadline={"enabled": False},
    )
    commands = Reader(env["kafka"], [env["prefix"] + ACCOUNT_COMMANDS_TOPIC])
    pub = Publisher(env["kafka"])
    events = env["prefix"] + TRANSFER_EVENTS_TOPIC
    timeout_first, reply_first = f"tf-{uuid.uuid4().hex[:6]}", f"rf-{uuid.uuid4().hex[:6]}"
    tables = tables_for(settings)
    url = settings.database.url.get_secret_value()
    try:
        with running(settings, [TransferSaga]):
            pub.event(events, timeout_first, _requested(timeout_first))
            pub.event(events, reply_first, _requested(reply_first))
            pub.flush()
            wait_until(
                lambda: _sql(env, "SELECT count(*) FROM saga_deadline") == [(2,)],
                what="both payment timeouts stored",
            )
        # Nobody consumes now: the order of the next three records is exactly as produced.
        latest = _sql(env, "SELECT max(due_at) FROM saga_deadline")[0][0]
        wait_until(lambda: _db_now(env) > latest, what="both deadlines due")
        store = PostgresDeadlineStore(lambda: connect(url), tables)
        producer = KafkaRecordProducer(
            lambda: make_producer(
                settings.kafka.client_config(), partitioner=settings.consumer.partitioner
            )
        )
        poller = DeadlinePoller(store, producer, holder="race-test", settings=settings.deadline)
        try:
            token = poller.acquire()
            assert token is not None
            pub.event(events, reply_first, _confirmed(reply_first))
            pub.flush()
            assert poller.sweep(token) == 2
            pub.event(events, timeout_first, _confirmed(timeout_first))
            pub.flush()
        finally:
            store.close()
            producer.close(5)
        with running(settings, [TransferSaga]):
            wait_until(
                lambda: (
                    ("event", "ignored-ended") in _history(env, timeout_first)
                    and ("deadline", "deadline-stale") in _history(env, reply_first)
                ),
                what="both losers recorded as no-ops",
            )
            commands.wait_for(
                lambda _: bool(
                    _of(commands, timeout_first, REVERSE) and _of(commands, reply_first, CREDIT)
                ),
                what="the winners' commands",
            )
            commands.poll(1.0)
        assert _history(env, timeout_first) == [
            ("event", "applied"),
            ("deadline", "applied"),
            ("event", "ignored-ended"),
        ]
        assert _history(env, reply_first) == [
            ("event", "applied"),
            ("event", "applied"),
            ("deadline", "deadline-stale"),
        ]
        assert len(_of(commands, timeout_first, REVERSE)) == 1
        assert _of(commands, timeout_first, CREDIT) == []
        assert len(_of(commands, reply_first, CREDIT)) == 1
        assert _of(commands, reply_first, REVERSE) == []
        # Reply and fired record really shared the saga's partition.
        for tid in (timeout_first, reply_first):
            spots = _sql(
                env, "SELECT DISTINCT topic, partition FROM saga_history WHERE saga_id = %s", tid
            )
            assert len(spots) == 1, spots
        assert _sql(env, "SELECT count(*) FROM saga_deadline") == [(0,)]
    finally:
        commands.close()


# -- scheduling rules, payloads and precision with a test-local saga ------------------------------


def _probe_env(env: dict[str, str], **deadline: Any) -> tuple[Any, Publisher, Reader, str]:
    settings = settings_for(
        env["kafka"], env["db"], env["schema"], env["prefix"], deadline=deadline
    )
    return (
        settings,
        Publisher(env["kafka"]),
        Reader(env["kafka"], [env["prefix"] + PROBE_COMMANDS]),
        env["prefix"] + PROBE_EVENTS,
    )


def _fired(reader: Reader, probe: str) -> list[Fired]:
    return [Fired.model_validate_json(m.value()) for m in _of(reader, probe, FIRED)]


def test_cancel_after_fire_reschedule_and_typed_payload(env: dict[str, str]) -> None:
    settings, pub, reader, events = _probe_env(
        env, polling={"interval": "1s"}, lease_ttl="4s", redispatch_after="3s"
    )
    cancel_late = f"cl-{uuid.uuid4().hex[:6]}"
    resched = f"rs-{uuid.uuid4().hex[:6]}"
    noted = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
    first = Reminder(text="first", amount=Decimal("1.00"), noted_at=noted)
    second = Reminder(text="second", amount=Decimal("12.34"), noted_at=noted)
    try:
        with running(settings, [Probe]):
            pub.event(
                events,
                cancel_late,
                Instructed(probe_id=cancel_late, schedule=[Plan(name="ping", after_s=1)]),
            )
            pub.event(
                events,
                resched,
                Instructed(
                    probe_id=resched, schedule=[Plan(name="reminder", after_s=600, reminder=first)]
                ),
            )
            pub.event(
                events,
                resched,
                Instructed(
                    probe_id=resched, schedule=[Plan(name="reminder", after_s=1, reminder=second)]
                ),
            )
            pub.flush()
            reader.wait_for(
                lambda _: bool(_fired(reader, cancel_late) and _fired(reader, resched)),
                what="both fired",
            )
            # Cancelling a deadline that already fired finds nothing: a recorded, applied no-op.
            pub.event(events, cancel_late, Instructed(probe_id=cancel_late, cancel=["ping"]))
            pub.flush()
            wait_until(lambda: len(_history(env, cancel_late)) == 3, what="late cancel handled")
            reader.poll(1.0)
        assert _history(env, cancel_late) == [
            ("event", "applied"),
            ("deadline", "applied"),
            ("event", "applied"),
        ]
        assert _sql(env, "SELECT status FROM saga_instance WHERE saga_id = %s", cancel_late) == [
            ("active",)
        ]
        assert [f.name for f in _fired(reader, cancel_late)] == ["ping"]
        # Only the latest schedule survives, and it fires once, with its own payload, typed.
        assert _fired(reader, resched) == [
            Fired(
                probe_id=resched,
                name="reminder",
                text="second",
                amount=Decimal("12.34"),
                noted_at=noted,
                payload_type="Reminder",
            )
        ]
        assert [k for k, _ in _history(env, resched)].count("deadline") == 1
        assert _sql(env, "SELECT count(*) FROM saga_deadline") == [(0,)]
    finally:
        reader.close()


def test_firing_is_prompt_whatever_the_polling_interval(env: dict[str, str]) -> None:
    interval = 30.0
    settings, pub, reader, events = _probe_env(
        env, polling={"interval": f"{interval:.0f}s"}, lease_ttl="2m", redispatch_after="30s"
    )
    ahead, past = f"ah-{uuid.uuid4().hex[:6]}", f"pa-{uuid.uuid4().hex[:6]}"
    try:
        with running(settings, [Probe]) as proc:
            # Let the poller take the lease and settle into its long sleep first, so the test
            # measures a wake-up, not the sweep every poller does when it starts.
            wait_until(
                lambda: proc.poller is not None and proc.poller.token is not None, what="lease"
            )
            due = datetime.now(UTC) + timedelta(seconds=2)
            sent = time.time()
            pub.event(
                events, ahead, Instructed(probe_id=ahead, schedule=[Plan(name="ping", at=due)])
            )
            pub.event(
                events,
                past,
                Instructed(
                    probe_id=past, schedule=[Plan(name="ping", at=due - timedelta(hours=1))]
                ),
            )
            pub.flush()
            reader.wait_for(
                lambda _: bool(_fired(reader, ahead) and _fired(reader, past)),
                timeout=interval - 5,
                what="both fired",
            )
        # Kafka timestamps are set when the relay produces the command: after the handler ran.
        ahead_at = _of(reader, ahead, FIRED)[0].timestamp()[1] / 1000
        past_at = _of(reader, past, FIRED)[0].timestamp()[1] / 1000
        lag = ahead_at - due.timestamp()
        print(f"fired {lag:.2f} s after due, {past_at - sent:.2f} s for a past instant")
        assert -0.5 < lag < 10, lag
        assert past_at - sent < 10
        assert len(_fired(reader, ahead)) == len(_fired(reader, past)) == 1
    finally:
        reader.close()


# -- operator commands --------------------------------------------------------------------------


def _cli(env: dict[str, str], settings: Any, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "processor", *args],
        cwd=REPO,
        env={**os.environ, **settings_env(settings), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_operator_listing_of_pending_and_overdue_deadlines(env: dict[str, str]) -> None:
    settings = settings_for(env["kafka"], env["db"], env["schema"], env["prefix"])
    tables = tables_for(settings)
    url = settings.database.url.get_secret_value()
    ensure_schema(url, tables)
    with connect(url, autocommit=True) as conn:
        conn.execute(
            tables.render(
                """
                INSERT INTO {deadline} (id, saga_type, saga_id, name, due_at, payload, topic,
                                        partition)
                VALUES (gen_random_uuid(), 'transfer-saga', 'tr-1', 'payment-timeout',
                        now() - interval '5 minutes', NULL, 'x', 0),
                       (gen_random_uuid(), 'transfer-saga', 'tr-1', 'reminder',
                        now() + interval '1 hour', '{{"text": "hi"}}', 'x', 0),
                       (gen_random_uuid(), 'transfer-saga', 'tr-2', 'payment-timeout',
                        now() - interval '1 minute', NULL, 'x', 1)
                """
            )
        )
        queries = OperatorQueries(conn, tables)
        pending = pending_deadlines(queries, "transfer-saga", "tr-1")
        assert [(d.name, d.payload) for d in pending] == [
            ("payment-timeout", None),
            ("reminder", {"text": "hi"}),
        ]
        overdue = overdue_deadlines(queries)
        assert [(d.saga_id, d.name) for d in overdue] == [
            ("tr-1", "payment-timeout"),
            ("tr-2", "payment-timeout"),
        ]
        assert overdue_deadlines(queries, limit=1) == overdue[:1]
        hour_later = datetime.now(UTC) + timedelta(hours=2)
        assert len(overdue_deadlines(queries, now=hour_later)) == 3

    out = _cli(env, settings, "deadlines", "transfer-saga", "tr-1").splitlines()
    assert out[0].split()[:3] == ["ID", "SAGA", "TYPE"]
    assert [line.split()[3] for line in out[1:]] == ["payment-timeout", "reminder"]
    assert '{"text": "hi"}' in out[2]

    out = _cli(env, settings, "overdue").splitlines()
    assert [line.split()[2] for line in out[1:]] == ["tr-1", "tr-2"]
    rows = json.loads(_cli(env, settings, "overdue", "--json"))
    assert [(r["saga_id"], r["name"]) for r in rows] == [
        ("tr-1", "payment-timeout"),
        ("tr-2", "payment-timeout"),
    ]

    assert _cli(env, settings, "deadlines", "transfer-saga", "nope").strip() == (
        "no deadlines scheduled for transfer-saga nope"
    )
