"""Memory stays bounded while a processor drains a backlog of thousands of megabytes.

Five hundred records of about 2 MB each (1 GB in all) wait on the input topic; one processor
process drains them with batches bounded at 16 MiB. Its resident memory is sampled throughout
and must stay far below what count-bounded batches would hold (a batch of 500 records of 2 MB
would be the whole gigabyte).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from decimal import Decimal

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from processor._authoring.messages import registry
from processor._postgres.schema.tables import Tables
from schemas.transfers import DebitAccount
from tests.e2e.conftest import E2EEnv
from tests.support.harness import headers_for, wait_until
from tests.support.procs import ProcessorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

RECORDS = 500
RECORD_BYTES = 2 * 1024 * 1024
MAX_BATCH_BYTES = 16 * 1024 * 1024
# The topic's and the consumer's record limit: above the records, below anything absurd.
MAX_RECORD_BYTES = 4 * 1024 * 1024
# What the process may hold at once: the client's fetch (16 MiB) and prefetch queue (32 MiB,
# both sized from max_batch_bytes), the batch being planned and the one being written (16 MiB
# of raw bytes each, and as much again for their decoded strings): about 100 MiB, on top of
# an idle interpreter with its libraries (~100 MB). 400 MB leaves room for allocator slack
# and still fails if batches were bounded by count (500 records of 2 MB would be 1 GB).
RSS_BOUND = 400 * 1024 * 1024


def _rss(pid: int) -> int:
    """Resident set size of a process in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0


class RssSampler:
    """Samples a process's resident memory every few milliseconds, keeping the peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss(self.pid))
            self.samples += 1
            self._stop.wait(0.02)

    @contextlib.contextmanager
    def running(self) -> Iterator[RssSampler]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(5)


def _allow_large_records(kafka: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka})
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes",
                str(MAX_RECORD_BYTES),
                incremental_operation=AlterConfigOpType.SET,
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def _delete_topic(kafka: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka})
    for future in admin.delete_topics([topic], operation_timeout=60).values():
        future.result(60)


def _publish_backlog(env: E2EEnv) -> None:
    """RECORDS uncompressed records of about RECORD_BYTES of a registered type no saga handles.

    DebitAccount is registered (the transfer saga sends it) but routed to no handler, so the
    engine decodes each record in full and skips it without storing it.
    """
    # Random text, so that nothing on the way (broker or client) can shrink it.
    filler = base64.b64encode(os.urandom(RECORD_BYTES * 3 // 4)).decode()
    producer = Producer(
        {
            "bootstrap.servers": env.kafka,
            "enable.idempotence": True,
            "message.max.bytes": MAX_RECORD_BYTES,
            "compression.type": "none",
        }
    )
    errors: list[object] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    for i in range(RECORDS):
        tid = f"big-{i:05d}"
        # A different head per record; the filler makes up the size.
        message = DebitAccount(transfer_id=tid, account_id=f"{i}-{filler}", amount=Decimal("1.00"))
        value = message.model_dump_json().encode()
        while True:
            try:
                producer.produce(
                    env.events_topic,
                    key=tid.encode(),
                    value=value,
                    headers=[*headers_for(message)],
                    on_delivery=delivered,
                )
                break
            except BufferError:  # the local queue is full: let the broker catch up
                producer.poll(0.5)
        producer.poll(0)
    assert producer.flush(300) == 0
    assert not errors, errors[:3]


def test_memory_stays_bounded_draining_a_backlog_of_2_mb_records(e2e_env: E2EEnv) -> None:
    env = e2e_env
    assert registry.of(DebitAccount).name == "transfers.DebitAccount"
    _allow_large_records(env.kafka, env.events_topic)
    try:
        started = time.monotonic()
        _publish_backlog(env)
        produced_in = time.monotonic() - started
        ends = env.end_offsets()
        assert sum(ends.values()) == RECORDS

        proc: ProcessorProcess = env.start(
            "large",
            consumer={
                "max_record_bytes": MAX_RECORD_BYTES,
                "max_batch_bytes": MAX_BATCH_BYTES,
                "batch_size": 500,
            },
        )
        with RssSampler(proc.pid).running() as rss:
            wait_until(
                lambda: (
                    {p: o or 0 for p, o in env.stored_offsets().items()} == ends or not proc.alive()
                ),
                timeout=600,
                what=f"stored offsets reach the end offsets {ends}",
            )
        assert proc.alive(), proc.log()[-3000:]
        assert {p: o or 0 for p, o in env.stored_offsets().items()} == ends
        # Decoded and skipped, not stored or dead-lettered.
        for table in ("saga_instance", "saga_history", "dead_letter", "parked_message"):
            assert env.scalar(f"SELECT count(*) FROM {table}") == 0, table
        assert rss.samples > 10
        print(
            json.dumps(
                {
                    "records": RECORDS,
                    "produced_s": round(produced_in, 1),
                    "peak_rss_mb": round(rss.peak / 2**20, 1),
                    "samples": rss.samples,
                }
            )
        )
        assert 0 < rss.peak < RSS_BOUND, f"peak RSS {rss.peak / 2**20:.0f} MiB"
    finally:
        for p in env.procs:
            p.stop()
        _delete_topic(env.kafka, env.events_topic)


DEAD_LETTERS = 200
# The relay's default round holds at most 16 MiB of rows (SAGA_RELAY__MAX_BATCH_BYTES); with
# the client's copies and the producer's queue, well under this. Rounds bounded by count
# alone (1,000 rows) would hold all 400 MB at once, twice over (driver and Python objects).
RELAY_RSS_BOUND = 300 * 1024 * 1024


def test_the_relay_holds_a_bounded_round_of_2_mb_dead_letters(e2e_env: E2EEnv) -> None:
    env = e2e_env
    tables = Tables(env.schema)
    with psycopg.connect(env.db, autocommit=True) as conn:
        # Stored dead letters keep their whole input record; these wait for the relay, as
        # they would behind a relay that was held back.
        conn.execute(
            tables.render(
                """
                INSERT INTO {outbox} (topic, headers, value)
                SELECT %s, jsonb_build_object('dead-letter-reason', 'invalid-text',
                                              'message-id', 'big-' || g),
                       convert_to(repeat(md5(g::text), %s), 'UTF8')
                  FROM generate_series(1, %s) AS g
                """
            ),
            (env.prefix + "saga-dead-letters", RECORD_BYTES // 32, DEAD_LETTERS),
        )
    proc: ProcessorProcess = env.start("relay")  # the shipped relay settings
    with RssSampler(proc.pid).running() as rss:
        wait_until(
            lambda: env.scalar("SELECT count(*) FROM outbox") == 0 or not proc.alive(),
            timeout=300,
            what="the outbox drained",
        )
    assert proc.alive(), proc.log()[-3000:]
    assert env.scalar("SELECT count(*) FROM outbox") == 0
    print(json.dumps({"dead_letters": DEAD_LETTERS, "peak_rss_mb": round(rss.peak / 2**20, 1)}))
    assert rss.samples > 10
    assert 0 < rss.peak < RELAY_RSS_BOUND, f"peak RSS {rss.peak / 2**20:.0f} MiB"
