"""The demo's accounts and requests: a deterministic mix of good transfers and injected faults."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from confluent_kafka import KafkaError, Producer

from processor import Message
from processor.publish import EventPublisher, EventRecordBuilder, PublishFailed
from sagas import EXAMPLE_SAGAS
from schemas.transfers import TransferRequested
from schemas.wallets import WalletTransferRequested

TRANSFER_SAGA = "transfer-saga"
WALLET_SAGA = "wallet-transfer"

# What each request should end as; the summary compares these with what happened.
COMPLETED = "completed"
FAILED = "failed"  # nothing was undone: there was nothing to undo
COMPENSATED = "compensated"  # what was done was undone
TIMED_OUT = "timed out"
REFUNDED = "refunded"

_ACCOUNTS = [f"acc-{n}" for n in range(1, 7)]
_WALLETS = [f"wal-{n}" for n in range(1, 5)]
_TOO_MUCH = Decimal("999999.00")  # more than any account holds: refused for insufficient funds


@dataclass(frozen=True)
class Request:
    saga_type: str
    transfer_id: str
    message: Message
    expect: str
    why: str


@dataclass(frozen=True)
class Scenario:
    balances: Mapping[str, Decimal]
    closed: frozenset[str]
    requests: Sequence[Request]
    # Transfers whose debit reply the accounts service drops, so the payment timeout fires.
    lost: frozenset[str]

    def expected(self, saga_type: str) -> int:
        return sum(1 for r in self.requests if r.saga_type == saga_type)


def scenario(run_id: str, transfers: int = 40, wallets: int = 20) -> Scenario:
    """Every eighth transfer runs out of funds, hits a closed/unknown account, or loses its reply;
    every fifth wallet transfer goes to a closed/unknown wallet or runs out of funds."""
    balances = {a: Decimal("1000.00") for a in _ACCOUNTS}
    balances |= {w: Decimal("500.00") for w in _WALLETS}
    balances |= {"acc-closed": Decimal("75.00"), "wal-closed": Decimal("20.00")}
    requests: list[Request] = []
    lost: set[str] = set()
    for i in range(transfers):
        tid = f"{run_id}-t{i:03d}"
        src, dst = _ACCOUNTS[i % 6], _ACCOUNTS[(i + 1) % 6]
        amount, expect, why = Decimal(10 + i % 17), COMPLETED, "ok"
        kind = i % 8
        if kind == 5:
            amount, expect, why = _TOO_MUCH, FAILED, "insufficient funds"
        elif kind == 6:
            dst = "acc-closed" if (i // 8) % 2 == 0 else "acc-missing"
            expect, why = COMPENSATED, f"credit to {dst}"
        elif kind == 7:
            lost.add(tid)
            expect, why = TIMED_OUT, "debit reply lost"
        msg = TransferRequested(
            transfer_id=tid, source_account_id=src, target_account_id=dst, amount=amount
        )
        requests.append(Request(TRANSFER_SAGA, tid, msg, expect, why))
    for i in range(wallets):
        tid = f"{run_id}-w{i:03d}"
        src, dst = _WALLETS[i % 4], _WALLETS[(i + 1) % 4]
        amount, expect, why = Decimal(5 + i % 11), COMPLETED, "ok"
        if i % 5 == 3:
            dst = "wal-closed" if (i // 5) % 2 == 0 else "wal-missing"
            expect, why = REFUNDED, f"credit to {dst}"
        elif i % 5 == 4:
            amount, expect, why = _TOO_MUCH, REFUNDED, "insufficient funds"
        msg2 = WalletTransferRequested(
            transfer_id=tid, from_wallet_id=src, to_wallet_id=dst, amount=amount
        )
        requests.append(Request(WALLET_SAGA, tid, msg2, expect, why))
    return Scenario(balances, frozenset({"acc-closed", "wal-closed"}), requests, frozenset(lost))


def publish(kafka: Mapping[str, str], prefix: str, requests: Sequence[Request]) -> None:
    """Publishes the requests as the upstream services would: keyed by transfer id (the sagas'
    association property), the transfer id also naming the conversation."""
    try:
        with EventPublisher(kafka, topic_prefix=prefix, sagas=EXAMPLE_SAGAS) as events:
            for r in requests:
                events.publish(r.message, correlation_id=r.transfer_id)
    except PublishFailed as e:
        raise RuntimeError(f"could not publish the demo requests: {e}") from e


def produce_event(
    producer: Producer,
    prefix: str,
    event: Message,
    key: str,
    message_id: str | None = None,
    on_delivery: Callable[[KafkaError | None, object], None] | None = None,
) -> None:
    """One domain event as an upstream service sends it, on a producer the caller flushes:
    keyed by ``key`` (also its correlation id), with the headers the event publisher sets, on
    its registered topic."""
    row = EventRecordBuilder(topic_prefix=prefix).build(
        event, key=key, message_id=message_id, correlation_id=key
    )
    producer.produce(
        row.topic,
        key=row.key,
        value=row.value,
        headers=dict(row.headers),
        on_delivery=on_delivery,
    )
