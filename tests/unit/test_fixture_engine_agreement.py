"""Property: the saga fixture and the consumer's engine path agree on what a saga does.

The fixture delivers one event per batch and fires one deadline at a time. The engine path here
does what the worker does: random batch boundaries, each batch planned on the stored rows
overlaid with the batch before it (committed or not yet), and due deadlines fired as the poller
would, all at once when they share a due time. Both must send the same commands in the same
order and leave each saga with the same state, end and pending deadlines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from processor._authoring.definition import SagaState
from processor._authoring.messages import Message, MessageMetadata, registry
from processor._engine.decode import decode
from processor._engine.plan import Planner
from processor._engine.records import Record
from processor._engine.rows import ENDED, PARKED, WriteSet
from processor._errors import HandlerError
from processor._invocation import bind
from processor._memory.store import MemoryBatchStore
from processor._wire import HEADER_MESSAGE_TYPE, HEADER_SCHEMA_VERSION
from processor.testing import DEFAULT_START_TIME, SagaFixture
from processor.testing._engine import dispatch, due_deadlines, event_record, sequential_ids
from sagas.order import OrderSaga
from sagas.transfer import TransferSaga
from sagas.wallet import WalletTransferSaga
from schemas import orders, transfers, wallets

AMOUNT = Decimal("25.00")
# "c" never gets a start event: everything sent to it is for a saga that does not exist.
SAGA_IDS = ("a", "b", "c")
STARTABLE = ("a", "b")

Make = Callable[[str], Message]


def _transfer(sid: str) -> dict[str, Any]:
    return {"transfer_id": sid}


def _wallet(sid: str) -> dict[str, Any]:
    return {"transfer_id": sid, "from_wallet_id": "w1", "to_wallet_id": "w2", "amount": AMOUNT}


def _order(sid: str) -> dict[str, Any]:
    return {"order_id": sid}


@dataclass(frozen=True)
class Spec:
    cls: type[SagaState]
    start: Make
    replies: tuple[Make, ...]


SPECS = {
    "transfer": Spec(
        TransferSaga,
        lambda s: transfers.TransferRequested(
            transfer_id=s, source_account_id="src", target_account_id="dst", amount=AMOUNT
        ),
        (
            lambda s: transfers.DebitConfirmed(**_transfer(s), account_id="src", amount=AMOUNT),
            lambda s: transfers.DebitFailed(**_transfer(s), account_id="src", reason="no funds"),
            lambda s: transfers.CreditConfirmed(**_transfer(s), account_id="dst", amount=AMOUNT),
            lambda s: transfers.CreditFailed(**_transfer(s), account_id="dst", reason="closed"),
        ),
    ),
    "wallet": Spec(
        WalletTransferSaga,
        lambda s: wallets.WalletTransferRequested(**_wallet(s)),
        (
            lambda s: wallets.TransferInitiated(**_wallet(s)),
            lambda s: wallets.TransferCompleted(**_wallet(s)),
            lambda s: wallets.TransferFailed(**_wallet(s), reason="frozen"),
            lambda s: wallets.TransferRefunded(**_wallet(s)),
        ),
    ),
    "order": Spec(
        OrderSaga,
        lambda s: orders.OrderPlaced(
            order_id=s, customer_id="cu", sku="sku-1", quantity=2, amount=AMOUNT
        ),
        (
            lambda s: orders.StockReserved(**_order(s)),
            lambda s: orders.StockUnavailable(**_order(s), reason="none left"),
            lambda s: orders.StockReservationFailed(**_order(s), reason="timeout"),
            lambda s: orders.StockReleased(**_order(s)),
            lambda s: orders.PaymentCaptured(**_order(s)),
            lambda s: orders.PaymentDeclined(**_order(s), reason="card"),
            lambda s: orders.PaymentRefunded(**_order(s)),
            lambda s: orders.RefundFailed(**_order(s), reason="gone"),
            lambda s: orders.FraudReviewApproved(**_order(s)),
            lambda s: orders.FraudReviewRejected(**_order(s), reason="risky"),
            lambda s: orders.OrderShipped(**_order(s)),
            lambda s: orders.ShipmentFailed(**_order(s), reason="lost"),
        ),
    ),
}

# Steps: a start event, a reply (index into the saga's replies), a redelivery of an earlier
# input (same message id), or time passing. Each event step carries whether a batch ends
# after it on the engine side (one in three), and whether the batch before it has committed
# when the next one is loaded.
CUT = st.integers(0, 2).map(lambda n: n == 0)
START = st.tuples(st.just("start"), st.sampled_from(STARTABLE), CUT, st.booleans())
REPLY = st.tuples(
    st.just("reply"),
    st.tuples(st.sampled_from(SAGA_IDS), st.integers(0, 11)),
    CUT,
    st.booleans(),
)
AGAIN = st.tuples(st.just("again"), st.integers(0, 1000), CUT, st.booleans())
TIME = st.tuples(
    st.just("time"),
    st.sampled_from(
        [
            timedelta(seconds=1),
            timedelta(seconds=20),
            timedelta(seconds=45),
            timedelta(minutes=10),
            timedelta(minutes=20),
            timedelta(hours=1),
            timedelta(days=1),
            timedelta(days=3),
        ]
    ),
    st.booleans(),
    st.booleans(),
)
FINAL_SWEEP = timedelta(days=3)
STEPS = st.lists(st.one_of(START, REPLY, START, REPLY, AGAIN, TIME), min_size=8, max_size=30)


@dataclass(frozen=True)
class Delivery:
    message: Message
    message_id: str
    saga_id: str


def _metadata(d: Delivery, offset: int, now: datetime) -> MessageMetadata:
    entry = registry.of(type(d.message))
    return MessageMetadata(
        message_id=d.message_id,
        message_type=entry.name,
        correlation_id=d.saga_id,
        causation_id=None,
        occurred_at=now,
        topic=entry.topic or "agreement",
        partition=0,
        offset=offset,
        key=d.saga_id,
        headers={},
    )


class EnginePath:
    """The worker's way through the engine, in memory and on a virtual clock."""

    def __init__(self, cls: type[SagaState]) -> None:
        self.bound = bind(cls)
        self.planner = Planner(
            {self.bound.saga_type: self.bound},
            registry=registry,
            dead_letter_topic="agreement.dead-letters",
            deadline_ids=sequential_ids(),
        )
        self.now = DEFAULT_START_TIME
        self.store = MemoryBatchStore(clock=lambda: self.now)
        self.store.tables.lease_token = 41
        self.queue: list[Record] = []
        self.in_flight: WriteSet | None = None
        self.offset = 0

    def deliver(self, d: Delivery, *, cut: bool, committed: bool) -> None:
        self.offset += 1
        meta = _metadata(d, self.offset, self.now)
        self.queue.append(event_record(d.message, meta, registry, self.offset))
        if cut:
            self.flush(committed=committed)

    def flush(self, *, committed: bool) -> None:
        """Plans the queued records as one batch, as the worker plans batch N+1 on top of N."""
        if not self.queue:
            return
        records, self.queue = self.queue, []
        decoded = [decode(r, registry, 1 << 20) for r in records]
        prepared = self.planner.prepare(decoded)
        prior = self.in_flight
        if committed:
            # The prior batch committed before this one was loaded; the overlay must still hold.
            self.settle()
        ws = self.planner.apply(prepared, self.store.load(prepared.wants), prior=prior)
        self.settle()
        self.in_flight = ws

    def settle(self) -> None:
        if self.in_flight is not None:
            self.store.write(self.in_flight, [])
            self.in_flight = None

    def elapse(self, delta: timedelta) -> None:
        """Fires due deadlines as the poller would: every deadline due at once in one batch."""
        self.flush(committed=False)
        self.settle()
        target = self.now + delta
        tables = self.store.tables
        while due := due_deadlines(tables, target):
            at = due[0].ref.due_at
            self.now = max(self.now, at)
            for deadline in (d for d in due if d.ref.due_at == at):
                self.offset += 1
                self.queue.append(dispatch(tables, deadline, self.offset))
            self.flush(committed=False)
            self.settle()
        self.now = target

    def commands(self) -> list[Message]:
        out = []
        for row in self.store.tables.outbox:
            entry = registry.by_name(
                row.headers[HEADER_MESSAGE_TYPE], int(row.headers[HEADER_SCHEMA_VERSION])
            )
            out.append(entry.cls.model_validate_json(row.value))
        return out

    def view(self, saga_id: str) -> tuple[SagaState | None, bool, dict[str, datetime]]:
        tables = self.store.tables
        row = tables.sagas.get((self.bound.saga_type, saga_id))
        state = self.bound.state_from_json(row.state) if row and row.state is not None else None
        pending = {
            d.ref.name: d.ref.due_at for d in tables.deadlines.values() if d.ref.saga_id == saga_id
        }
        return state, row is not None and row.status == ENDED, pending


def _fixture_view(
    fixture: SagaFixture, saga_id: str
) -> tuple[SagaState | None, bool, dict[str, datetime]]:
    fixture.saga_id = saga_id
    return fixture.state, fixture.ended, fixture.pending_deadlines


@settings(max_examples=50, deadline=None, derandomize=True, database=None)
@given(kind=st.sampled_from(sorted(SPECS)), steps=STEPS)
def test_fixture_and_engine_agree(kind: str, steps: list[tuple[str, Any, bool, bool]]) -> None:
    spec = SPECS[kind]
    fixture = SagaFixture(spec.cls)
    engine = EnginePath(spec.cls)
    sent: list[Message] = []
    history: list[Delivery] = []
    failed: str | None = None
    for i, (what, arg, cut, committed) in enumerate(steps):
        if what == "time":
            sent += fixture.when_time_elapses(arg).commands
            engine.elapse(arg)
            assert engine.commands() == sent
            continue
        if what == "start":
            d = Delivery(spec.start(arg), f"m-{i}", arg)
        elif what == "reply":
            saga_id, n = arg
            d = Delivery(spec.replies[n % len(spec.replies)](saga_id), f"m-{i}", saga_id)
        elif history:
            d = history[arg % len(history)]
        else:
            continue
        history.append(d)
        meta = _metadata(d, i + 1, fixture.now)
        try:
            sent += fixture.when(d.message, metadata=meta).commands
        except HandlerError:
            # The engine parks the saga where the fixture raises; compare what came before.
            failed = d.saga_id
            engine.deliver(d, cut=True, committed=committed)
            break
        engine.deliver(d, cut=cut, committed=committed)
    engine.flush(committed=False)
    engine.settle()
    _agree(fixture, engine, sent, failed)
    if failed is None:
        # Let every pending deadline fire, so deadlines that fall due together show their order.
        sent += fixture.when_time_elapses(FINAL_SWEEP).commands
        engine.elapse(FINAL_SWEEP)
        _agree(fixture, engine, sent, failed)


def _agree(
    fixture: SagaFixture, engine: EnginePath, sent: list[Message], failed: str | None
) -> None:
    assert engine.commands() == sent
    assert not engine.store.tables.dead_letters
    for saga_id in SAGA_IDS:
        if saga_id == failed:
            row = engine.store.tables.sagas[(engine.bound.saga_type, saga_id)]
            assert row.status == PARKED
            continue
        assert engine.view(saga_id) == _fixture_view(fixture, saga_id), saga_id
    assert engine.view("c") == (None, False, {})
