"""The outbox relay over the in-memory adapters: order, acknowledgement, rollback, the lock."""

from __future__ import annotations

import threading

import pytest

from processor.engine.records import OutboxRow
from processor.errors import DeliveryFailed, Failure, Retryable, RuntimeFailure
from processor.memory.outbox import MemoryOutboxStore
from processor.memory.producer import MemoryRecordProducer
from processor.runtime.hooks import Hooks
from processor.runtime.relay import Relay


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


def make(
    batch_size: int = 100, hooks: Hooks | None = None
) -> tuple[MemoryOutboxStore, MemoryRecordProducer, Relay]:
    store = MemoryOutboxStore()
    producer = MemoryRecordProducer()
    relay = Relay(store, producer, batch_size=batch_size, poll_interval=0.01, hooks=hooks)
    return store, producer, relay


def test_publishes_in_id_order_and_removes_the_rows() -> None:
    store, producer, relay = make()
    rows = [command("a", 1), command("b", 1), command("a", 2), command("c", 1), command("b", 2)]
    store.append(rows)

    assert relay.run_once() == 5

    assert producer.records("commands") == rows
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


def test_a_refused_record_rolls_the_whole_round_back() -> None:
    store, producer, relay = make()
    rows = [command("a", 1), command("b", 1), command("a", 2)]
    store.append(rows)
    producer.fail(where=lambda r: r.saga_id == "b", times=1)

    with pytest.raises(DeliveryFailed) as info:
        relay.run_once()

    assert [f.index for f in info.value.failures] == [1]
    assert info.value.kind is Failure.RETRYABLE
    # Even the acknowledged rows stay: removing them alone would let a saga's later row pass.
    assert [e.row for e in store.pending()] == rows
    assert relay.published == 0

    # The next round sends the whole batch again, in order, under the same message ids.
    assert relay.run_once() == 3
    assert ids(producer.records("commands")) == ["a-1", "a-2", "a-1", "b-1", "a-2"]
    assert store.pending() == []


def test_a_permanently_refused_record_is_not_removed_either() -> None:
    store, producer, relay = make()
    store.append([command("a", 1), command("a", 2, "closed")])
    producer.fail(topic="closed", permanent=True)

    for _ in range(2):
        with pytest.raises(DeliveryFailed) as info:
            relay.run_once()
        assert info.value.kind is Failure.ROW_REFUSED

    assert ids([e.row for e in store.pending()]) == ["a-1", "a-2"]


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
