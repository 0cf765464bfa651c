"""Bad records interleaved with good ones on the same partitions and saga keys stop nothing.

Two replicas consume transfer events mixed with every kind of record the store cannot hold or
the engine cannot read, plus a forged deadline-fired record and a saga whose stored state no
longer loads. Every good saga finishes, every bad record is dead-lettered with its reason (the
forged record is recorded as rejected, the unloadable saga is parked with its later records
held), no replica exits and the stored input position reaches the end of every partition.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import pytest

from processor.wire import DEADLINE_FIRED, HEADER_DEAD_LETTER_REASON, FiredRecord
from schemas.transfers import TransferRequested
from tests.e2e.conftest import (
    DRAIN_TIMEOUT,
    E2EEnv,
    Workload,
    new_workload,
    publish_steps,
)
from tests.support.harness import Publisher, Reader, headers_for, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SAGAS = 24
# Low enough that a padded record of a few kB is refused as oversized, high enough for every
# good record and every other bad one.
MAX_RECORD_BYTES = 2048


@dataclass(frozen=True)
class Bad:
    """One bad record as published, and the dead-letter reason it must get."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    reason: str


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
        out.append(Bad(key if key is not None else tid.encode(), value, headers, reason))

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
    return out


def _publish_bad(pub: Publisher, env: E2EEnv, bad: list[Bad]) -> None:
    for b in bad:
        pub.raw(env.events_topic, b.key, b.value, b.headers)
    pub.flush()


def test_good_sagas_finish_among_bad_records_with_two_replicas(e2e_env: E2EEnv) -> None:
    env = e2e_env
    consumer = {"max_record_bytes": MAX_RECORD_BYTES}
    replicas = [env.start(f"mix-{i}", consumer=consumer) for i in range(2)]
    workload: Workload = new_workload(SAGAS)
    tids = list(workload.events)
    # The last three sagas play special parts; the bad records use the others' keys.
    unloadable, victim, forger = tids[-3], tids[-2], tids[-1]
    bad = _bad_records(tids[:-3])
    first, second = bad[: len(bad) // 2], bad[len(bad) // 2 :]
    pub = Publisher(env.kafka)
    dead = Reader(env.kafka, [env.prefix + "saga-dead-letters"])
    try:
        _publish_bad(pub, env, first)
        publish_steps(env, workload, range(1))
        wait_until(
            lambda: (
                env.scalar("SELECT count(*) FROM saga_instance WHERE status = 'active'") == SAGAS
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

        # The rest of the good steps, with the other half of the bad records between them.
        publish_steps(env, workload, range(1, 2))
        _publish_bad(pub, env, second)
        publish_steps(env, workload, range(2, 3))

        good = [t for t in tids if t != unloadable]
        wait_until(
            lambda: (
                env.scalar(
                    "SELECT count(*) FROM saga_instance WHERE status = 'ended' AND version = 3"
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
        dead.wait_for(lambda rs: len(rs) >= len(bad), timeout=DRAIN_TIMEOUT, what="dead letters")
    finally:
        dead.close()

    # No replica exited, and both were given work (six partitions between two replicas).
    assert all(p.alive() for p in replicas), [p.log()[-3000:] for p in replicas]

    # Every good saga ended after its three events; the bad records changed none of them.
    rows = dict(env.query("SELECT saga_id, status FROM saga_instance"))
    assert rows == {t: ("parked" if t == unloadable else "ended") for t in tids}
    versions = dict(
        env.query("SELECT saga_id, version FROM saga_instance WHERE saga_id <> %s", unloadable)
    )
    assert set(versions.values()) == {3}

    # Every bad record is dead-lettered once, with its reason, in the table and on the topic.
    stored = Counter((bytes(k), r) for k, r in env.query("SELECT key, reason FROM dead_letter"))
    assert stored == Counter((b.key, b.reason) for b in bad)
    assert all(d for (d,) in env.query("SELECT detail FROM dead_letter"))
    on_topic = Counter((m.key(), dead.headers(m)[HEADER_DEAD_LETTER_REASON]) for m in dead.records)
    assert on_topic == stored

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
    assert env.scalar("SELECT count(*) FROM failed_outbox") == 0
