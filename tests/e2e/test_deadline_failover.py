"""Deadline poller failover with real processes: crash, pause and full restart of the leader."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from processor._postgres.connect import ensure_schema
from processor._postgres.schema.tables import Tables
from processor._wire import (
    DEADLINE_FIRED,
    HEADER_DEADLINE_ID,
    HEADER_FENCING_TOKEN,
    HEADER_MESSAGE_TYPE,
    FiredRecord,
)
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC, TransferRequested
from tests.support.harness import Publisher, Reader, create_topics, query, settings_for, wait_until
from tests.support.procs import ProcessorProcess, processes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

APP = "sagas.app:transfer_app"
REVERSE = "transfers.ReverseDebit"
# settings_for: polling interval 1 s, lease TTL 4 s.
INTERVAL, TTL = 1.0, 4.0
# A loaded shared machine (two cores, several test runs) delays everything by seconds.
SLACK = 15.0


@pytest.fixture
def env(
    kafka_bootstrap: str, database_url: str, pg_schema: str, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    topics = [prefix + t for t in (TRANSFER_EVENTS_TOPIC, ACCOUNT_COMMANDS_TOPIC)]
    topics.append(prefix + "saga-dead-letters")
    create_topics(kafka_bootstrap, topics, partitions=3)
    # Migrated up front so the test can watch the lease table from the first moment, in the
    # layout the processes will use (the Citus phase runs them on buckets too).
    db = settings_for(kafka_bootstrap, database_url, pg_schema, prefix).database
    ensure_schema(database_url, Tables(pg_schema), db.distributed, buckets=db.buckets)
    yield {
        "kafka": kafka_bootstrap,
        "db": database_url,
        "schema": pg_schema,
        "prefix": prefix,
        "logs": tmp_path,
    }
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_topics(topics, operation_timeout=30).values():
        future.result()


def _sql(env: dict[str, Any], text: str, *args: Any) -> list[tuple[Any, ...]]:
    return query(env["db"], env["schema"], text, *args)


def _process(env: dict[str, Any], name: str, timeout_s: int) -> ProcessorProcess:
    settings = settings_for(
        env["kafka"],
        env["db"],
        env["schema"],
        env["prefix"],
        instance_id=name,
        settings={"transfer.payment-timeout": timeout_s},
    )
    return ProcessorProcess(settings, env["logs"] / f"{name}.log", app=APP)


def _start_transfers(env: dict[str, Any], count: int) -> list[str]:
    pub = Publisher(env["kafka"])
    ids = [f"tr-{uuid.uuid4().hex[:8]}" for _ in range(count)]
    for tid in ids:
        event = TransferRequested(
            transfer_id=tid, source_account_id="A", target_account_id="B", amount=Decimal("5.00")
        )
        pub.event(env["prefix"] + TRANSFER_EVENTS_TOPIC, tid, event)
    pub.flush()
    return ids


DeadlineRow = tuple[str, str, datetime, str, int]


def _deadlines(env: dict[str, Any]) -> list[DeadlineRow]:
    return [
        (i, s, d, t, p)
        for i, s, d, t, p in _sql(
            env, "SELECT id::text, saga_id, due_at, topic, partition FROM saga_deadline"
        )
    ]


def _wait_for_deadlines(env: dict[str, Any], count: int) -> list[DeadlineRow]:
    wait_until(lambda: len(_deadlines(env)) == count, timeout=120, what="every deadline stored")
    return _deadlines(env)


def _stale(env: dict[str, Any]) -> int:
    sql = "SELECT count(*) FROM saga_history WHERE outcome = 'deadline-stale'"
    return int(_sql(env, sql)[0][0])


def _lease(env: dict[str, Any]) -> tuple[str, int, datetime] | None:
    rows = _sql(env, "SELECT holder, token, expires_at FROM saga_deadline_lock")
    return (str(rows[0][0]), int(rows[0][1]), rows[0][2]) if rows else None


def _all_ended(env: dict[str, Any], ids: list[str]) -> bool:
    rows = _sql(env, "SELECT count(*) FROM saga_instance WHERE status = 'ended'")
    return rows == [(len(ids),)]


def _assert_each_deadline_took_effect_once(
    env: dict[str, Any], ids: list[str], commands: Reader
) -> None:
    applied = _sql(
        env,
        "SELECT saga_id, count(*) FROM saga_history"
        " WHERE kind = 'deadline' AND outcome = 'applied' GROUP BY saga_id",
    )
    assert dict(applied) == dict.fromkeys(ids, 1)
    commands.wait_for(
        lambda _: _reverse_ids(commands).keys() == set(ids), what="a ReverseDebit per saga"
    )
    commands.poll(1.0)
    # The relay publishes at least once; the effect is one command row, one message id.
    assert {tid: len(mids) for tid, mids in _reverse_ids(commands).items()} == dict.fromkeys(ids, 1)
    assert _sql(env, "SELECT count(*) FROM saga_deadline") == [(0,)]


def _reverse_ids(commands: Reader) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m in commands.records:
        h = commands.headers(m)
        if h.get("message-type") == REVERSE:
            out.setdefault(h["saga-id"], set()).add(h["message-id"])
    return out


def _fired_records(inputs: Reader) -> list[tuple[str, int, float]]:
    """(deadline id, fencing token, produce time) of each deadline-fired record seen."""
    out = []
    for m in inputs.records:
        h = inputs.headers(m)
        if h.get(HEADER_MESSAGE_TYPE) == DEADLINE_FIRED:
            out.append(
                (h[HEADER_DEADLINE_ID], int(h[HEADER_FENCING_TOKEN]), m.timestamp()[1] / 1000)
            )
    return out


def test_killed_leader_is_replaced_within_lease_ttl_and_nothing_fires_twice(
    env: dict[str, Any],
) -> None:
    # Due about when the dead leader's lease expires: the survivor must take over to fire them.
    a, b = _process(env, "proc-a", 3), _process(env, "proc-b", 3)
    inputs = Reader(env["kafka"], [env["prefix"] + TRANSFER_EVENTS_TOPIC])
    commands = Reader(env["kafka"], [env["prefix"] + ACCOUNT_COMMANDS_TOPIC])
    try:
        with processes(a, b):
            wait_until(lambda: _lease(env), timeout=120, what="a lease holder")
            ids = _start_transfers(env, 8)
            rows = _wait_for_deadlines(env, len(ids))
            lease = _lease(env)
            assert lease is not None
            holder, dead_token, expires_at = lease
            leader, survivor = (a, b) if holder == "proc-a" else (b, a)
            leader.kill()
            killed_at = time.time()
            wait_until(lambda: _all_ended(env, ids), timeout=120, what="every saga timed out")
            new = _lease(env)
            assert new is not None
            assert new[0] != holder
            assert new[1] > dead_token
            inputs.wait_for(
                lambda _: {d for d, _, _ in _fired_records(inputs)} >= {r[0] for r in rows},
                what="fired records",
            )
            assert survivor.alive()
        _assert_each_deadline_took_effect_once(env, ids, commands)
        # Each deadline was fired by the survivor no later than its lease could be taken over
        # (the dead leader's lease expiry) or the deadline's own due time, plus one sweep.
        first_fire: dict[str, float] = {}
        for did, token, at in _fired_records(inputs):
            if token > dead_token:
                first_fire[did] = min(at, first_fire.get(did, at))
        lags = []
        by_lease = 0
        for did, _, due, _, _ in rows:
            if did not in first_fire:
                continue  # fired by the leader before it died (a loaded machine was slow)
            bound = max(due.timestamp(), expires_at.timestamp())
            by_lease += expires_at.timestamp() > due.timestamp()
            lags.append(first_fire[did] - bound)
        assert lags, "the leader fired everything before it was killed; nothing was tested"
        print(
            f"killed {holder} at {killed_at:.1f}; survivor fired {len(lags)} deadlines, "
            f"{by_lease} due before the lease expired; "
            f"worst {max(lags):.2f} s past max(due, lease expiry)"
        )
        assert max(lags) < INTERVAL + SLACK
    finally:
        inputs.close()
        commands.close()


def test_paused_leader_cannot_fire_after_losing_the_lease(env: dict[str, Any]) -> None:
    a, b = _process(env, "proc-a", 12), _process(env, "proc-b", 12)
    commands = Reader(env["kafka"], [env["prefix"] + ACCOUNT_COMMANDS_TOPIC])
    zombie = Producer({"bootstrap.servers": env["kafka"]})
    try:
        with processes(a, b):
            wait_until(lambda: _lease(env), timeout=120, what="a lease holder")
            ids = _start_transfers(env, 6)
            rows = _wait_for_deadlines(env, len(ids))
            lease = _lease(env)
            assert lease is not None
            holder, old_token, _ = lease
            leader = a if holder == "proc-a" else b
            leader.signal(signal.SIGSTOP)
            paused_at = time.time()
            wait_until(
                lambda: (_lease(env) or (holder,))[0] != holder,
                timeout=TTL + INTERVAL + SLACK,
                what="the other process to take the lease",
            )
            new = _lease(env)
            assert new is not None
            print(f"lease moved {time.time() - paused_at:.1f} s after the pause (TTL {TTL:.0f} s)")
            # What a paused leader that had claimed these deadlines would emit on waking: fired
            # records carrying its old fencing token, on each saga's own partition.
            for did, saga_id, _, topic, partition in rows:
                fired = FiredRecord("transfer-saga", saga_id, did, "payment-timeout", old_token)
                zombie.produce(
                    topic,
                    key=fired.key(),
                    value=fired.value(),
                    partition=partition,
                    headers=list(fired.headers().items()),
                )
            assert zombie.flush(30) == 0
            leader.signal(signal.SIGCONT)
            # The resumed leader has run a poller step and learnt it lost the lease.
            wait_until(
                lambda: f"deadline lease lost by {holder}" in leader.log(),
                timeout=60,
                what="the resumed leader to notice",
            )
            wait_until(lambda: _all_ended(env, ids), timeout=120, what="every saga timed out")
            wait_until(
                lambda: _stale(env) >= len(ids),
                timeout=120,
                what="the ex-leader's records recorded as no-ops",
            )
            stale = _stale(env)
            print(f"{stale} stale deadline records recorded")
            final = _lease(env)
            assert final is not None
            assert final[0] == new[0]
            assert final[1] == new[1]
        _assert_each_deadline_took_effect_once(env, ids, commands)
        assert "deadline lease won by " + holder not in leader.log().split("lease lost by")[-1]
    finally:
        commands.close()


def test_deadline_due_while_everything_is_down_fires_once_after_restart(
    env: dict[str, Any],
) -> None:
    commands = Reader(env["kafka"], [env["prefix"] + ACCOUNT_COMMANDS_TOPIC])
    try:
        first = (_process(env, "proc-a", 6), _process(env, "proc-b", 6))
        with processes(*first):
            wait_until(lambda: _lease(env), timeout=120, what="a lease holder")
            ids = _start_transfers(env, 3)
            wait_until(
                lambda: (
                    _sql(env, "SELECT count(*) FROM saga_deadline") == [(len(ids),)]
                    and _sql(env, "SELECT count(*) FROM outbox") == [(0,)]
                ),
                timeout=120,
                what="timeouts stored and DebitAccount sent",
            )
            # Stopping now, before they are due (6 s), leaves them for the next start.
            for p in first:
                p.signal(signal.SIGTERM)
            for p in first:
                p.stop()
        rows = _deadlines(env)
        if len(rows) < len(ids):
            pytest.fail("deadlines fired before the processes stopped; the machine is too slow")
        latest = max(r[2] for r in rows)
        wait_until(
            lambda: _sql(env, "SELECT now() > %s", latest + timedelta(seconds=1))[0][0],
            timeout=60,
            what="every deadline overdue while nothing runs",
        )
        assert len(_deadlines(env)) == len(ids), "a deadline disappeared while nothing ran"
        second = (_process(env, "proc-c", 6),)
        with processes(*second):
            started = time.time()
            wait_until(lambda: _all_ended(env, ids), timeout=120, what="every saga timed out")
            print(f"overdue deadlines handled {time.time() - started:.1f} s after the restart")
        _assert_each_deadline_took_effect_once(env, ids, commands)
    finally:
        commands.close()
