"""Bad records and bad sagas interleaved with good ones on the same partitions stop nothing.

Three replicas consume transfer events mixed with every kind of record the store cannot hold or
the engine cannot read (header names that are not UTF-8 among them), a forged deadline-fired
record, a saga whose stored state no longer loads, sagas whose handlers leave a state that
cannot be stored as JSON, and records of 2 MB that are dead-lettered while every relay is held
back. Every good saga finishes, every bad record is dead-lettered once with its reason (the
forged record is recorded as rejected, the unloadable and the unstorable sagas are parked), no
replica exits, the stored input position reaches the end of every partition and no replica's
resident memory grew past a bound.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

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

from processor._engine.partitioner import partition_for
from processor._postgres.outbox import partition_lock_key, relay_lock_key
from processor._postgres.schema.tables import Tables
from processor._runtime.relay import HEADER_DEAD_LETTER_TRUNCATED
from processor._wire import DEADLINE_FIRED, HEADER_DEAD_LETTER_REASON, FiredRecord
from schemas.transfers import TransferRequested
from tests.e2e.conftest import (
    DRAIN_TIMEOUT,
    E2EEnv,
    Workload,
    new_workload,
    publish_steps,
)
from tests.e2e.poison_app import BLOB_SAGA, BlobPut
from tests.support.harness import Publisher, Reader, headers_for, wait_until
from tests.support.procs import ProcessorProcess
from tests.support.raw_headers import produce_raw_headers

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# The transfer saga and a saga whose handler may leave an unstorable state (tests/e2e/poison_app).
APP = "tests.e2e.poison_app:app"
REPLICAS = 3
SAGAS = 60
TRANSFER = "transfer-saga"
# Low enough that a padded record of a few kB is refused as oversized, high enough for every
# good record and every other bad one.
MAX_RECORD_BYTES = 2048
# Records of 2 MB, over the broker's default limit of 1 MB: the input topic is set to take
# them; the dead-letter topic keeps the default, so the relay sends their dead letters cut
# (the table keeps them whole).
BIG_RECORDS = 16
BIG_BYTES = 2 * 1024 * 1024
INPUT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# The relay's largest record (its shipped default): a dead letter over it goes out cut to fit.
RELAY_MAX_RECORD_BYTES = 1_000_000
# Peak resident memory (VmHWM) of each replica, with the shipped batch and round bounds: an
# idle interpreter with its libraries (~100 MB), the client's fetch and prefetch queue (16 and
# 32 MiB, sized from max_batch_bytes), the batch being planned and the one being written, and
# a relay round (at most 16 MiB of rows, with their cut copies and the producer's). Measured
# at 90-150 MB. Released, each relay finds its share of the 2 MB dead letters waiting at once.
# (tests/e2e/test_large_records.py shows the bounds against backlogs far above them.)
RSS_BOUND = 250 * 1024 * 1024

BAD_BYTES = "state cannot be stored as JSON: a bytes value is not valid UTF-8"
BAD_TEXT = "state cannot be stored as JSON: a string holds a lone surrogate (not valid Unicode)"


@dataclass(frozen=True)
class Bad:
    """One bad record as published, and the dead-letter reason it must get."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    reason: str
    # A header name that is not valid UTF-8, added on the wire (confluent-kafka cannot send it).
    raw_name: bytes | None = None


def _requested(tid: str, **fields: object) -> dict[str, object]:
    body: dict[str, object] = {
        "transfer_id": tid,
        "source_account_id": "A",
        "target_account_id": "B",
        "amount": "10.00",
    }
    body.update(fields)
    return body


def _bad_records(tids: list[str]) -> list[Bad]:
    """Every bad kind, each keyed by one of the good sagas (so it shares its partition)."""
    out: list[Bad] = []

    def add(i: int, reason: str, key: bytes | None = None, **kw: object) -> None:
        tid = tids[i % len(tids)]
        value = kw.pop("value", None)
        if value is None:
            value = json.dumps(_requested(tid)).encode()
        assert isinstance(value, bytes)
        headers = kw.pop("headers", None)
        if headers is None:
            headers = headers_for(TransferRequested.model_validate(_requested(tid)))
        assert isinstance(headers, list)
        raw_name = kw.pop("raw_name", None)
        assert raw_name is None or isinstance(raw_name, bytes)
        out.append(Bad(key if key is not None else tid.encode(), value, headers, reason, raw_name))

    def with_header(tid: str, name: str, value: bytes) -> list[tuple[str, bytes]]:
        msg = TransferRequested.model_validate(_requested(tid))
        return [(k, value if k == name else v) for k, v in headers_for(msg)]

    add(0, "invalid-id", key=tids[0].encode() + b"\x00")
    add(1, "invalid-header", headers=with_header(tids[1], "message-id", b"m\x00"))
    add(2, "invalid-header", headers=[*with_header(tids[2], "x", b""), ("trace", b"a\x00b")])
    add(
        3, "invalid-text", value=json.dumps(_requested(tids[3], source_account_id="A\x00")).encode()
    )
    add(4, "invalid-id", value=json.dumps(_requested("x" * 600)).encode())
    # In the first half: read by a replica that has read (almost) nothing yet.
    add(12, "invalid-header", raw_name=b"\xff\xfe-name")
    add(5, "invalid-id", key=b"\xff" + tids[5].encode())
    add(6, "unparseable", value=b'{"transfer_id": "' + tids[6].encode() + b'", ')
    add(7, "unknown-type", headers=with_header(tids[7], "message-type", b"transfers.Nope"))
    add(8, "schema-violation", value=json.dumps(_requested(tids[8], amount="-5")).encode())
    add(9, "oversized", value=json.dumps(_requested(tids[9], pad="p" * 3000)).encode())
    add(
        10,
        "missing-message-id",
        headers=[(k, v) for k, v in with_header(tids[10], "x", b"") if k != "message-id"],
    )
    add(
        11,
        "schema-violation",
        value=b"{}",
        headers=[("message-type", DEADLINE_FIRED.encode()), ("message-id", b"fired-1")],
    )
    # In the second half: read by replicas that have read many records (a call site the
    # interpreter has specialised once read a broken header list where a fresh one raised).
    add(13, "invalid-header", raw_name=b"\xc3(")
    add(14, "invalid-header", raw_name=b"name-\x80")
    return out


def _big_records(tids: list[str]) -> list[Bad]:
    """BIG_RECORDS transfer requests of about BIG_BYTES, keyed by good sagas: oversized."""
    out: list[Bad] = []
    for i in range(BIG_RECORDS):
        tid = tids[i % len(tids)]
        # Random text: nothing on the way can shrink it.
        pad = base64.b64encode(os.urandom(BIG_BYTES * 3 // 4)).decode()
        value = json.dumps(_requested(tid, pad=pad)).encode()
        headers = headers_for(TransferRequested.model_validate(_requested(tid)))
        out.append(Bad(tid.encode(), value, headers, "oversized"))
    return out


def _publish_bad(pub: Publisher, env: E2EEnv, bad: list[Bad]) -> None:
    for b in bad:
        if b.raw_name is None:
            pub.raw(env.events_topic, b.key, b.value, b.headers)
            continue
        # On the partition the good producers send the key to: among that saga's records.
        produce_raw_headers(
            env.kafka,
            env.events_topic,
            partition_for(b.key, env.partitions, "crc32"),
            b.key,
            b.value,
            [*((k.encode(), v) for k, v in b.headers), (b.raw_name, b"x")],
        )
    pub.flush()


def _allow_big_records(env: E2EEnv) -> None:
    admin = AdminClient({"bootstrap.servers": env.kafka})
    resource = ConfigResource(
        ResourceType.TOPIC,
        env.events_topic,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes",
                str(INPUT_MAX_MESSAGE_BYTES),
                incremental_operation=AlterConfigOpType.SET,
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def _publish_big(env: E2EEnv, big: list[Bad]) -> None:
    producer = Producer(
        {
            "bootstrap.servers": env.kafka,
            "enable.idempotence": True,
            "message.max.bytes": INPUT_MAX_MESSAGE_BYTES,
        }
    )
    errors: list[object] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    for b in big:
        producer.produce(
            env.events_topic,
            key=b.key,
            value=b.value,
            headers=[*b.headers],
            on_delivery=delivered,
        )
    assert producer.flush(60) == 0
    assert not errors, errors


@contextmanager
def _relays_held_back(env: E2EEnv) -> Iterator[None]:
    """Every replica's relay claims nothing while this holds both relay locks exclusively.

    The way an operator moving failed outbox rows holds them: a relay's claim then takes
    neither the rows of no partition nor those of the partitions it owns, and the outbox grows.
    """
    tables = Tables(env.schema)
    with psycopg.connect(env.db, autocommit=True) as conn:
        for key in (relay_lock_key(tables), partition_lock_key(tables)):
            conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (key,))
        yield
        conn.execute("SELECT pg_advisory_unlock_all()")


def _peak_rss(proc: ProcessorProcess) -> int:
    """The process's peak resident set size in bytes (VmHWM), read while it runs."""
    with open(f"/proc/{proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {proc.pid}")


def _start(env: E2EEnv, name: str) -> ProcessorProcess:
    """A replica running APP (`env.start` runs the transfer app alone)."""
    settings = env.settings(
        instance_id=name,
        consumer={"max_record_bytes": MAX_RECORD_BYTES},
        relay={"max_record_bytes": RELAY_MAX_RECORD_BYTES},
    )
    proc = ProcessorProcess(settings, env.logs / f"{name}.log", app=APP)
    env.procs.append(proc)  # stopped by the fixture, whatever happens
    return proc


def test_good_sagas_finish_among_bad_records_and_sagas_with_three_replicas(
    e2e_env: E2EEnv,
) -> None:
    env = e2e_env
    _allow_big_records(env)
    replicas = [_start(env, f"mix-{i}") for i in range(REPLICAS)]
    names = {f"mix-{i}" for i in range(REPLICAS)}
    workload: Workload = new_workload(SAGAS)
    tids = list(workload.events)
    # The last three sagas play special parts; the bad records use the others' keys.
    unloadable, victim, forger = tids[-3], tids[-2], tids[-1]
    bad = _bad_records(tids[:-3])
    first, second = bad[: len(bad) // 2], bad[len(bad) // 2 :]
    # One header name that is not UTF-8 in each half (see _bad_records).
    assert sum(b.raw_name is not None for b in first) == 1
    big = _big_records(tids[:-3])
    # Sagas whose state cannot be stored (parked), among others of their type that end.
    run = uuid.uuid4().hex[:6]
    blobs = {f"blob-{run}-{i}": BlobPut(blob_id=f"blob-{run}-{i}", raw="6869") for i in range(4)}
    unstorable = {f"blob-{run}-bytes": BAD_BYTES, f"blob-{run}-text": BAD_TEXT}
    blobs[f"blob-{run}-bytes"] = BlobPut(blob_id=f"blob-{run}-bytes", raw="ff")
    blobs[f"blob-{run}-text"] = BlobPut(blob_id=f"blob-{run}-text", text="SURROGATE")
    pub = Publisher(env.kafka)
    dead = Reader(env.kafka, [env.prefix + "saga-dead-letters"])
    try:
        # All three own partitions before any record is published: each gets its share.
        wait_until(
            lambda: (
                {o for (o,) in env.query("SELECT DISTINCT owner FROM consumer_offset")} == names
            ),
            timeout=DRAIN_TIMEOUT,
            what=f"{REPLICAS} replicas owning partitions",
        )
        _publish_bad(pub, env, first)
        publish_steps(env, workload, range(1))
        wait_until(
            lambda: (
                env.scalar(
                    "SELECT count(*) FROM saga_instance WHERE saga_type = %s AND status = 'active'",
                    TRANSFER,
                )
                == SAGAS
            ),
            timeout=DRAIN_TIMEOUT,
            what=f"{SAGAS} transfers requested",
        )

        # A deploy that no longer reads this saga's stored state (a field it does not know).
        env.query(
            "UPDATE saga_instance SET state = state || '{\"renamed\": 1}' "
            "WHERE saga_id = %s RETURNING saga_id",
            unloadable,
        )

        # The victim's payment timeout, fired under the forger's saga id with the current
        # token: only the saga it names is wrong.
        [(did,)] = env.query("SELECT id::text FROM saga_deadline WHERE saga_id = %s", victim)
        lease = env.query("SELECT token FROM saga_deadline_lock")
        forged = FiredRecord(
            "transfer-saga", forger, did, "payment-timeout", lease[0][0] if lease else 1
        )
        pub.raw(
            env.events_topic,
            forger.encode(),
            forged.value(),
            [(k, v.encode()) for k, v in forged.headers().items()],
        )
        pub.flush()
        wait_until(
            lambda: env.query(
                "SELECT outcome, detail FROM saga_history WHERE saga_id = %s AND kind = 'deadline'",
                forger,
            ),
            timeout=DRAIN_TIMEOUT,
            what="the forged record judged",
        )

        # The rest of the good steps, with the other half of the bad records, the sagas that
        # cannot be stored and the 2 MB records between them, while no relay publishes: their
        # dead letters wait in the outbox, whole.
        with _relays_held_back(env):
            publish_steps(env, workload, range(1, 2))
            _publish_bad(pub, env, second)
            for blob_id, put in blobs.items():
                pub.event(env.events_topic, blob_id, put)
            pub.flush()
            _publish_big(env, big)
            publish_steps(env, workload, range(2, 3))
            wait_until(
                lambda: (
                    env.scalar(
                        "SELECT count(*) FROM outbox WHERE headers->>%s = 'oversized' "
                        "AND octet_length(value) > %s",
                        HEADER_DEAD_LETTER_REASON,
                        BIG_BYTES,
                    )
                    == len(big)
                ),
                timeout=DRAIN_TIMEOUT,
                what=f"{len(big)} dead letters of 2 MB waiting in the outbox",
            )
            assert all(p.alive() for p in replicas), [p.log()[-3000:] for p in replicas]

        good = [t for t in tids if t != unloadable]
        wait_until(
            lambda: (
                env.scalar(
                    "SELECT count(*) FROM saga_instance "
                    "WHERE saga_type = %s AND status = 'ended' AND version = 3",
                    TRANSFER,
                )
                == len(good)
            ),
            timeout=DRAIN_TIMEOUT,
            what=f"{len(good)} good sagas ended",
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
        dead.wait_for(
            lambda rs: len(rs) >= len(bad) + len(big), timeout=DRAIN_TIMEOUT, what="dead letters"
        )
        # Read while they run (a process that has ended has no /proc entry).
        peaks = {p.log_path.stem: _peak_rss(p) for p in replicas}
    finally:
        dead.close()

    # No replica exited, and all three were given work (six partitions between them).
    assert all(p.alive() for p in replicas), [p.log()[-3000:] for p in replicas]
    print(json.dumps({"peak_rss_mb": {n: round(v / 2**20, 1) for n, v in peaks.items()}}))
    assert all(0 < v < RSS_BOUND for v in peaks.values()), peaks

    # Every good saga ended after its three events; the bad records changed none of them. Of
    # the blob sagas, the ones whose state cannot be stored are parked, the others ended.
    rows = dict(env.query("SELECT saga_id, status FROM saga_instance"))
    assert rows == {
        **{t: ("parked" if t == unloadable else "ended") for t in tids},
        **{b: ("parked" if b in unstorable else "ended") for b in blobs},
    }
    versions = dict(
        env.query(
            "SELECT saga_id, version FROM saga_instance WHERE saga_type = %s AND saga_id <> %s",
            TRANSFER,
            unloadable,
        )
    )
    assert set(versions.values()) == {3}

    # Every bad record is dead-lettered once, with its reason, in the table and on the topic.
    stored = Counter((bytes(k), r) for k, r in env.query("SELECT key, reason FROM dead_letter"))
    assert stored == Counter((b.key, b.reason) for b in [*bad, *big])
    assert all(d for (d,) in env.query("SELECT detail FROM dead_letter"))
    on_topic = Counter((m.key(), dead.headers(m)[HEADER_DEAD_LETTER_REASON]) for m in dead.records)
    assert on_topic == stored
    [(unreadable,)] = env.query(
        "SELECT count(*) FROM dead_letter WHERE detail = 'a header name is not valid UTF-8'"
    )
    assert unreadable == sum(b.raw_name is not None for b in bad)

    # The 2 MB dead letters: whole in the table, cut to fit the relay's limit on the topic,
    # saying how large they were.
    whole = Counter((b.key, b.value) for b in big)
    kept = env.query(
        "SELECT key, value FROM dead_letter "
        "WHERE reason = 'oversized' AND octet_length(value) > %s",
        BIG_BYTES,
    )
    assert Counter((bytes(k), bytes(v)) for k, v in kept) == whole
    cut = [m for m in dead.records if HEADER_DEAD_LETTER_TRUNCATED in dead.headers(m)]
    assert Counter(
        (m.key(), int(dead.headers(m)[HEADER_DEAD_LETTER_TRUNCATED])) for m in cut
    ) == Counter((b.key, len(b.value)) for b in big)
    assert all(len(m.value()) < RELAY_MAX_RECORD_BYTES for m in cut)

    # The forged record had no effect and was recorded as rejected; the victim's deadline
    # was cancelled by its own debit confirmation, not fired.
    [(outcome, detail)] = env.query(
        "SELECT outcome, detail FROM saga_history WHERE kind = 'deadline'"
    )
    assert outcome == "deadline-rejected"
    assert "another saga" in detail

    # The saga whose state does not load is parked, not dead-lettered, with a reason that
    # names the error, and its two later events are held behind it.
    [(reason,)] = env.query(
        "SELECT parked_reason FROM saga_instance WHERE saga_id = %s", unloadable
    )
    assert "stored state does not load into TransferSaga: ValidationError at renamed" in reason
    held = env.query(
        "SELECT headers->>'message-id' FROM parked_message WHERE saga_id = %s ORDER BY id",
        unloadable,
    )
    assert [h for (h,) in held] == workload.events[unloadable][1:]
    assert env.scalar("SELECT count(*) FROM dead_letter WHERE key = %s", unloadable.encode()) == 0

    # The sagas whose handler left a state that cannot be stored as JSON are parked, not
    # dead-lettered, with a reason that names the problem (not the value), their record kept.
    parked = env.query(
        "SELECT saga_id, parked_reason FROM saga_instance "
        "WHERE saga_type = %s AND status = 'parked'",
        BLOB_SAGA,
    )
    assert dict(parked) == unstorable
    assert (
        dict(
            env.query("SELECT saga_id, reason FROM parked_message WHERE saga_type = %s", BLOB_SAGA)
        )
        == unstorable
    )
    keys = [b.encode() for b in blobs]
    assert env.scalar("SELECT count(*) FROM dead_letter WHERE key = ANY(%s)", keys) == 0
    assert env.scalar("SELECT count(*) FROM failed_outbox") == 0
