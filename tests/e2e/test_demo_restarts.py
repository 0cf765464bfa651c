"""The demo's accounts service goes on after PostgreSQL and the Kafka broker restart.

The shared services are never restarted: this test runs on a private PostgreSQL cluster and
Kafka broker from ``deploy/local`` on free ports (``tests.support.private_stack``), restarts
those under load, and leaves them running for the next test that restarts them.
"""

from __future__ import annotations

import logging
import threading
import uuid
from decimal import Decimal

import pytest
from confluent_kafka import Consumer, TopicPartition

from demo.accounts import AccountsService
from schemas.transfers import (
    ACCOUNT_COMMANDS_TOPIC,
    TRANSFER_EVENTS_TOPIC,
    CreditAccount,
    DebitAccount,
)
from tests.support.harness import Publisher, Reader, create_topics, query, wait_until
from tests.support.private_stack import PrivateStack
from tests.support.tell import notice, participant_state, replaced_clients

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

ACCOUNTS = {f"acc{i}": Decimal("1000.00") for i in range(6)}
PER_PHASE = 40


def test_accounts_service_survives_postgres_and_kafka_restarts(
    private_stack: PrivateStack, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> None:
    # The service's rebalances, in the report of a failure.
    caplog.set_level(logging.INFO, logger="processor._runtime.participant.service")
    # A private stack, the broker reached directly (see test_restarts_under_load).
    stack = private_stack
    prefix = f"rs{uuid.uuid4().hex[:6]}."
    commands, replies = prefix + ACCOUNT_COMMANDS_TOPIC, prefix + TRANSFER_EVENTS_TOPIC
    create_topics(stack.kafka, [commands, replies], partitions=3)
    schema = f"accounts_{prefix.rstrip('.')}"
    service = AccountsService(
        kafka={"bootstrap.servers": stack.kafka},
        database_url=stack.database,
        schema=schema,
        topic_prefix=prefix,
        application_name=f"accounts-{prefix}",
    )
    service.open_accounts(ACCOUNTS)
    before = service.total()
    stop = threading.Event()
    runner = threading.Thread(target=service.run, args=(stop,), name="accounts", daemon=True)
    reader = Reader(stack.kafka, [replies])
    published: list[str] = []

    def publish(phase: str) -> None:
        pub = Publisher(stack.kafka)
        names = sorted(ACCOUNTS)
        for n in range(PER_PHASE):
            tid = f"{phase}-{n}"
            src, dst = names[n % len(names)], names[(n + 1) % len(names)]
            amount = Decimal("1.25")
            pub.event(commands, tid, DebitAccount(transfer_id=tid, account_id=src, amount=amount))
            pub.event(commands, tid, CreditAccount(transfer_id=tid, account_id=dst, amount=amount))
            published.append(tid)
        pub.flush()

    def answered(records: list[object]) -> bool:
        # One confirmation per step: a debit and a credit for every transfer published so far.
        seen = {(reader.headers(m)["message-type"], m.key().decode()) for m in records}  # type: ignore[attr-defined]
        wanted = {
            (t, tid)
            for tid in published
            for t in ("transfers.DebitConfirmed", "transfers.CreditConfirmed")
        }
        return wanted <= seen

    def wait_for_replies(timeout: float, what: str) -> None:
        try:
            reader.wait_for(answered, timeout=timeout, what=what)
        except AssertionError as e:
            report = diagnose(stack, schema, commands, reader, published)
            state = participant_state(service.service)
            raise AssertionError(f"{e}\n{report}\naccounts {service.counters}\n{state}") from None

    runner.start()
    try:
        publish("p1")
        wait_for_replies(60, "replies before any restart")

        # PostgreSQL goes away while commands keep coming: the service must notice, wait, and
        # replace its connection once the server is back.
        stack.down("postgres")
        publish("p2")
        wait_until(lambda: service.counters.failed_batches > 0, timeout=60, what="a failed batch")
        stack.up("postgres")
        wait_for_replies(120, "replies after the PostgreSQL restart")
        assert service.reconnects >= 1

        # The broker restarts with commands in flight.
        publish("p3")
        stack.down("kafka")
        stack.up("kafka")
        publish("p4")
        wait_for_replies(180, "replies after the broker restart")
    finally:
        stop.set()
        runner.join(60)
        reader.close()
    assert not runner.is_alive()
    # Every step applied exactly once: each transfer moved money from one account to another.
    steps = service.ledger.steps()
    assert len(steps) == 2 * len(published)
    assert {outcome for _, _, outcome in steps} == {"applied"}
    assert service.total() == before
    if replaced := replaced_clients(service.service):
        notice(request, f"the accounts service's consumer client was replaced {replaced} time(s)")
    if reader.replaced:
        notice(request, f"the test's reader client was replaced {reader.replaced} time(s)")
    service.close()


def diagnose(
    stack: PrivateStack, schema: str, commands: str, reader: Reader, published: list[str]
) -> str:
    """Where the commands and replies stand, for a failure message: which side stopped.

    Stored positions behind the command log's ends: the service stopped reading. Replies
    waiting in its outbox: its relay stopped. Neither, and replies missing: the reader stopped.
    """
    lines: list[str] = []
    seen = {m.key().decode() for m in reader.records}
    by_phase: dict[str, int] = {}
    for tid in published:
        if tid not in seen:
            by_phase[tid.split("-")[0]] = by_phase.get(tid.split("-")[0], 0) + 1
    lines.append(f"transfers with no reply read, by phase: {by_phase}")
    try:
        at = reader.consumer.position(reader.consumer.assignment())
        lines.append(f"reader positions {[(tp.partition, tp.offset) for tp in at]}")
    except Exception as e:  # the report must not hide the failure it explains
        lines.append(f"reader assignment unknown: {e!r}")
    probe = Consumer({"bootstrap.servers": stack.kafka, "group.id": "report"})
    try:
        ends = [probe.get_watermark_offsets(TopicPartition(commands, p), 10)[1] for p in range(3)]
        lines.append(f"command log ends {ends}")
    except Exception as e:
        lines.append(f"command log ends unknown: {e!r}")
    finally:
        probe.close()
    try:
        q = f'"{schema}"'
        positions = query(
            stack.database,
            schema,
            f"SELECT partition, next_offset, owner, updated_at FROM {q}.consumer_offset"
            " ORDER BY partition",
        )
        waiting = query(stack.database, schema, f"SELECT count(*) FROM {q}.outbox")
        inbox = query(stack.database, schema, f"SELECT count(*) FROM {q}.inbox")
        lines.append(f"stored positions {positions}; replies waiting {waiting}; inbox {inbox}")
    except Exception as e:
        lines.append(f"database unreadable: {e!r}")
    return "\n".join(lines)
