"""The outbox relay over the in-memory adapters: order, acknowledgement, rollback, the lock."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

import pytest

from processor._engine.records import OutboxRow
from processor._errors import DeliveryFailed, Failure, Retryable, RuntimeFailure
from processor._memory.outbox import MemoryOutboxStore
from processor._memory.producer import MemoryRecordProducer
from processor._runtime.hooks import Hooks
from processor._runtime.relay import HEADER_DEAD_LETTER_TRUNCATED, Relay, fits, record_size
from processor.ops._outbox import (
    NothingSelected,
    discard_failed_rows,
    list_failed_rows,
    retry_failed_rows,
)


def command(saga_id: str, n: int, topic: str = "commands") -> OutboxRow:
    return OutboxRow(
        saga_type="transfer",
        saga_id=saga_id,
        topic=topic,
        key=saga_id.encode(),
        headers={"message-id": f"{saga_id}-{n}"},
        value=f"{saga_id}:{n}".encode(),
    )


def ids(rows: list[OutboxRow]) -> list[str]:
    return [r.headers["message-id"] for r in rows]


def dead_letter(n: int, topic: str = "dead") -> OutboxRow:
    headers = {
        "message-id": f"dl-{n}",
        "dead-letter-reason": "undecodable",
        "dead-letter-detail": "not JSON",
        "source-topic": "events",
        "source-partition": "0",
        "source-offset": str(n),
    }
    return OutboxRow(None, None, topic, b"k", headers, b"bad")


def make(
    batch_size: int = 100,
    hooks: Hooks | None = None,
    max_attempts: int = 10,
    max_record_bytes: int = 1_000_000,
) -> tuple[MemoryOutboxStore, MemoryRecordProducer, Relay]:
    store = MemoryOutboxStore()
    producer = MemoryRecordProducer()
    relay = Relay(
        store,
        producer,
        batch_size=batch_size,
        poll_interval=0.01,
        max_attempts=max_attempts,
        max_record_bytes=max_record_bytes,
        hooks=hooks,
    )
    return store, producer, relay


def test_publishes_each_sagas_rows_in_id_order_and_removes_the_rows() -> None:
    store, producer, relay = make()
    rows = [command("a", 1), command("b", 1), command("a", 2), command("c", 1), command("b", 2)]
    store.append(rows)

    assert relay.run_once() == 5

    sent = ids(producer.records("commands"))
    assert sorted(sent) == sorted(ids(rows))
    for saga in "abc":
        assert [m for m in sent if m.startswith(saga)] == [
            m for m in ids(rows) if m.startswith(saga)
        ]
    # A saga's second row goes in a later wave than every saga's first.
    assert sent.index("a-2") > sent.index("c-1")
    assert store.pending() == []
    assert relay.published == 5


def test_rows_go_to_their_own_topics_in_order() -> None:
    store, producer, relay = make()
    store.append([command("a", 1, "x"), command("a", 2, "y"), command("a", 3, "x")])

    relay.run_once()

    assert ids(producer.records("x")) == ["a-1", "a-3"]
    assert ids(producer.records("y")) == ["a-2"]


def test_a_round_takes_at_most_a_batch_in_id_order() -> None:
    store, producer, relay = make(batch_size=2)
    store.append([command("a", n) for n in range(1, 6)])

    assert relay.run_once() == 2
    assert ids([e.row for e in store.pending()]) == ["a-3", "a-4", "a-5"]
    assert relay.run_once() == 2
    assert relay.run_once() == 1
    assert relay.run_once() == 0
    assert ids(producer.records("commands")) == [f"a-{n}" for n in range(1, 6)]


def test_rows_are_removed_only_after_every_acknowledgement() -> None:
    hooks = Hooks()
    store, producer, relay = make(hooks=hooks)
    store.append([command("a", 1), command("a", 2)])
    at_produce: list[tuple[list[str], list[str]]] = []
    hooks.on(
        "after-produce",
        lambda: at_produce.append(
            (ids(producer.records("commands")), ids([e.row for e in store.pending()]))
        ),
    )

    relay.run_once()

    # Acknowledged, and still in the outbox until the round commits.
    assert at_produce == [(["a-1", "a-2"], ["a-1", "a-2"])]
    assert store.pending() == []


def test_a_transiently_refused_row_stays_with_its_saga_behind_it_and_others_go() -> None:
    store, producer, relay = make()
    rows = [command("a", 1), command("b", 1), command("a", 2), command("b", 2)]
    store.append(rows)
    producer.fail(where=lambda r: r.headers["message-id"] == "b-1", times=1)

    assert relay.run_once() == 2

    assert [f.reason for f in relay.last_failures] == ["injected failure"]
    assert ids(producer.records("commands")) == ["a-1", "a-2"]
    # b-2 was never sent: it waits behind b-1, which counted one attempt.
    assert [(e.row.headers["message-id"], e.attempts) for e in store.pending()] == [
        ("b-1", 1),
        ("b-2", 0),
    ]

    assert relay.run_once() == 2
    assert ids(producer.records("commands")) == ["a-1", "a-2", "b-1", "b-2"]
    assert store.pending() == []
    assert relay.last_failures == []


def test_a_round_where_nothing_goes_through_rolls_back_without_counting() -> None:
    store, producer, relay = make(max_attempts=2)
    rows = [command("a", 1), command("b", 1)]
    store.append(rows)
    producer.fail(times=6)

    for _ in range(3):
        with pytest.raises(DeliveryFailed) as info:
            relay.run_once()
        assert info.value.kind is Failure.RETRYABLE

    # A broker outage fills no failed outbox.
    assert [(e.row, e.attempts) for e in store.pending()] == [(r, 0) for r in rows]
    assert store.list_failed() == []
    assert relay.run_once() == 2


def test_the_same_transient_failure_past_max_attempts_sets_the_row_aside() -> None:
    store, producer, relay = make(max_attempts=3)
    store.append([command("a", 1), command("a", 2), command("b", 1)])
    producer.fail(where=lambda r: r.headers["message-id"] == "a-1", reason="timed out")

    published = 0
    for n in range(1, 4):
        store.append([command("b", n + 1)])
        published += relay.run_once()

    assert published == 4
    failed = store.list_failed()
    assert [(f.row.headers["message-id"], f.held_behind) for f in failed] == [
        ("a-1", None),
        ("a-2", failed[0].id),
    ]
    assert failed[0].attempts == 3
    assert failed[0].reason == "timed out (after 3 attempts)"
    assert store.pending() == []
    assert ids(producer.records("commands")) == ["b-1", "b-2", "b-3", "b-4"]


def test_a_permanently_refused_row_is_set_aside_and_its_saga_waits_behind_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, producer, relay = make()
    rows = [
        command("a", 1),
        command("a", 2, "closed"),
        command("b", 1),
        command("a", 3),
        dead_letter(1, "closed"),
        dead_letter(2),
    ]
    store.append(rows)
    producer.fail(topic="closed", permanent=True, reason="Unknown topic or partition")

    with caplog.at_level(logging.WARNING, logger="processor._runtime.relay"):
        assert relay.run_once() == 3

    assert ids(producer.records("commands")) == ["a-1", "b-1"]
    assert ids(producer.records("dead")) == ["dl-2"]
    failed = store.list_failed()
    assert [(f.row.headers["message-id"], f.held_behind, f.reason) for f in failed] == [
        ("a-2", None, "Unknown topic or partition"),
        ("a-3", failed[0].id, f"held behind failed outbox row {failed[0].id}"),
        # A row of no saga blocks nothing.
        ("dl-1", None, "Unknown topic or partition"),
    ]
    assert store.pending() == []
    assert relay.set_aside == 3
    # Logged once each, with what an operator needs and never the payload.
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "saga transfer a, message-id a-2, topic closed" in lines[0]
    assert "Unknown topic or partition" in lines[0]
    assert "message-id dl-1" in lines[2]
    assert not any("a:2" in line or "a:3" in line for line in lines)

    # Later rows of the saga wait behind it too, in later rounds; other sagas flow.
    store.append([command("a", 4), command("c", 1)])
    assert relay.run_once() == 1
    assert [f.row.headers["message-id"] for f in store.list_failed()] == [
        "a-2",
        "a-3",
        "dl-1",
        "a-4",
    ]
    assert ids(producer.records("commands")) == ["a-1", "b-1", "c-1"]


def test_retry_puts_a_sagas_rows_back_in_order_and_they_are_published() -> None:
    store, producer, relay = make()
    store.append([command("a", 1, "closed"), command("a", 2), command("b", 1)])
    producer.fail(topic="closed", permanent=True, times=1)
    relay.run_once()
    store.append([command("a", 3)])
    relay.run_once()
    assert len(store.list_failed()) == 3

    moved = retry_failed_rows(store, saga_type="transfer", saga_id="a")

    assert [m.row.headers["message-id"] for m in moved] == ["a-1", "a-2", "a-3"]
    assert store.list_failed() == []
    # Back under their own ids, ahead of anything committed since.
    store.append([command("c", 1)])
    assert ids([e.row for e in store.pending()]) == ["a-1", "a-2", "a-3", "c-1"]
    assert relay.run_once() == 4
    assert ids(producer.records("closed")) == ["a-1"]
    assert ids(producer.records("commands")) == ["b-1", "c-1", "a-2", "a-3"]


def test_retry_by_row_id_takes_the_whole_saga_and_discard_only_that_row() -> None:
    store, producer, relay = make()
    store.append([command("a", 1, "closed"), command("a", 2), dead_letter(1, "closed")])
    producer.fail(topic="closed", permanent=True)
    # Refused together, then each alone: then they are set aside.
    assert relay.run_once() == 0
    assert store.list_failed() == []
    assert relay.run_once() == 0
    first, held, letter = store.list_failed()

    with pytest.raises(NothingSelected):
        discard_failed_rows(store, reason=" ", row_id=first.id)
    with pytest.raises(NothingSelected):
        retry_failed_rows(store, saga_type="transfer")
    with pytest.raises(NothingSelected):
        retry_failed_rows(store, row_id=999)

    gone = discard_failed_rows(store, reason="refund done by hand", row_id=first.id)
    assert [g.id for g in gone] == [first.id]
    assert [f.id for f in store.list_failed()] == [held.id, letter.id]

    back = retry_failed_rows(store, row_id=held.id)
    assert [b.id for b in back] == [held.id]
    assert [f.id for f in list_failed_rows(store)] == [letter.id]
    assert relay.run_once() == 1
    assert ids(producer.records("commands")) == ["a-2"]


def test_an_oversized_command_is_set_aside_unsent_and_a_dead_letter_is_cut_to_fit() -> None:
    store, producer, relay = make(max_record_bytes=2000)
    big = replace(command("a", 1), value=b"x" * 5000)
    letter = replace(dead_letter(1), value=b"y" * 5000)
    store.append([big, command("a", 2), letter, command("b", 1)])

    assert relay.run_once() == 2

    assert ids(producer.records("commands")) == ["b-1"]
    (sent,) = producer.records("dead")
    assert sent.headers[HEADER_DEAD_LETTER_TRUNCATED] == "5000"
    assert sent.headers["source-offset"] == "1"
    assert len(sent.value) > 0
    assert record_size(sent) <= 2000
    assert sent.value == letter.value[: len(sent.value)]
    failed = store.list_failed()
    assert [f.row.headers["message-id"] for f in failed] == ["a-1", "a-2"]
    assert failed[0].reason == f"record of {record_size(big)} bytes over 2000"


def test_rows_refused_together_are_sent_alone_before_one_is_set_aside() -> None:
    store, producer, relay = make()
    store.append([command("a", 1, "small"), command("b", 1, "small"), command("c", 1)])
    # The broker refuses a whole request for one large record: both fail the first time.
    producer.fail(topic="small", permanent=True, times=2, reason="Message size too large")
    producer.fail(
        where=lambda r: r.headers["message-id"] == "a-1",
        permanent=True,
        reason="Message size too large",
    )

    assert relay.run_once() == 1
    assert store.list_failed() == []
    assert relay.run_once() == 1

    assert ids(producer.records("small")) == ["b-1"]
    assert [(f.row.headers["message-id"], f.attempts) for f in store.list_failed()] == [("a-1", 2)]


def test_a_failing_producer_rolls_the_round_back() -> None:
    hooks = Hooks()
    store, producer, relay = make(hooks=hooks)
    rows = [command("a", 1), command("a", 2)]
    store.append(rows)
    producer.raise_retryable()
    produced: list[str] = []
    hooks.on("after-produce", lambda: produced.append("after-produce"))

    with pytest.raises(Retryable):
        relay.run_once()

    assert [e.row for e in store.pending()] == rows
    assert produced == []
    assert relay.run_once() == 2


def test_idle_while_another_relay_holds_the_lock() -> None:
    store, producer, relay = make()
    store.append([command("a", 1)])

    with store.held_elsewhere():
        assert relay.run_once() == 0
    assert producer.calls == 0
    assert len(store.pending()) == 1

    assert relay.run_once() == 1


def test_an_empty_outbox_sends_nothing_and_fires_no_after_produce() -> None:
    hooks = Hooks()
    _store, producer, relay = make(hooks=hooks)
    fired: list[str] = []
    hooks.on("after-produce", lambda: fired.append("after-produce"))

    assert relay.run_once() == 0
    assert producer.calls == 0
    assert fired == []


def test_a_crash_at_after_produce_leaves_the_acknowledged_rows_in_the_outbox() -> None:
    hooks = Hooks()
    store, producer, relay = make(hooks=hooks)
    store.append([command("a", 1), command("a", 2)])
    fired: list[int] = []

    def crash() -> None:
        fired.append(len(producer.records("commands")))
        raise KeyboardInterrupt

    hooks.on("after-produce", crash)

    with pytest.raises(KeyboardInterrupt):
        relay.run_once()

    assert fired == [2]
    assert ids([e.row for e in store.pending()]) == ["a-1", "a-2"]


def test_run_backs_off_after_transient_failures_and_goes_on() -> None:
    hooks = Hooks()
    store, producer, relay = make(hooks=hooks)
    store.append([command("a", 1)])
    producer.raise_retryable()
    producer.fail(times=1)
    stop = threading.Event()
    # The first round to get through ends the loop; it still commits.
    hooks.on("after-produce", stop.set)

    relay.run(stop)

    assert producer.calls == 3
    assert store.pending() == []
    assert relay.published == 1
    assert producer.closed


def test_run_ends_with_any_other_failure() -> None:
    hooks = Hooks()
    store, _producer, relay = make(hooks=hooks)
    store.append([command("a", 1)])

    def bug() -> None:
        raise RuntimeFailure("a bug")

    hooks.on("relay-round", bug)

    with pytest.raises(RuntimeFailure, match="a bug"):
        relay.run(threading.Event())
    assert len(store.pending()) == 1


def test_close_closes_the_store() -> None:
    store, _producer, relay = make()
    relay.close()
    assert store.closed


@pytest.mark.parametrize(
    "headers",
    [
        {"message-id": "m" * 36, "message-type": "transfers.DebitAccount"},
        # Multi-byte characters: the exact size is more than the characters counted once.
        {"note": "\u00e9\u4e2d\U0001f600" * 50, "\u00e9t\u00e9": "x"},
        {},
    ],
)
def test_fits_agrees_with_the_exact_size_on_both_sides_of_the_limit(
    headers: dict[str, str],
) -> None:
    row = OutboxRow("t", "s1", "cmds", b"key", headers, b"v" * 300)
    size = record_size(row)
    for limit in (size - 1, size, size + 1, size * 4, size // 2):
        assert fits(row, limit) == (size <= limit), limit


def test_a_stopped_relay_publishes_the_rows_committed_before_the_stop_in_batches() -> None:
    store, producer, relay = make(batch_size=2)
    committed = threading.Event()
    relay.drain_on_stop = committed
    stop = threading.Event()
    stop.set()
    ended = threading.Event()

    def run() -> None:
        relay.run(stop)
        ended.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    # The last batch commits after the stop was asked for: its rows are published too.
    store.append([command("a", n) for n in range(1, 6)])
    assert not ended.is_set()
    committed.set()
    thread.join(10)
    assert ended.is_set()
    assert ids(producer.records("commands")) == [f"a-{n}" for n in range(1, 6)]
    assert store.pending() == []


def test_without_the_cue_a_stopped_relay_ends_and_the_rows_stay() -> None:
    store, producer, relay = make()
    relay.flush_timeout = 0.05
    relay.drain_on_stop = threading.Event()  # the last batch never reports committed
    store.append([command("a", 1)])
    stop = threading.Event()
    stop.set()
    relay.run(stop)
    assert producer.records("commands") == []
    assert ids([e.row for e in store.pending()]) == ["a-1"]


def test_a_store_that_fails_during_the_last_rounds_leaves_the_rows_and_the_stop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hooks = Hooks()

    def unreachable() -> None:
        raise Retryable("database unreachable")

    hooks.on("relay-round", unreachable)
    store, producer, relay = make(hooks=hooks)
    committed = threading.Event()
    committed.set()
    relay.drain_on_stop = committed
    store.append([command("a", 1)])
    stop = threading.Event()
    stop.set()
    with caplog.at_level(logging.WARNING):
        relay.run(stop)
    assert producer.records("commands") == []
    assert ids([e.row for e in store.pending()]) == ["a-1"]
    assert "relay stopped before publishing every committed row" in caplog.text
