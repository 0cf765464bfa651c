"""Seed 000's worked example, TransferSaga with a payment timeout, on virtual time."""

from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.testing import DEFAULT_START_TIME, SagaFixture
from sagas.transfer import PAYMENT_TIMEOUT, TransferSaga
from schemas.transfers import (
    CreditAccount,
    CreditConfirmed,
    CreditFailed,
    DebitAccount,
    DebitConfirmed,
    DebitFailed,
    ReverseDebit,
    TransferRequested,
)

T0 = DEFAULT_START_TIME
AMOUNT = Decimal("25.00")
REQUESTED = TransferRequested(
    transfer_id="t-1", source_account_id="src", target_account_id="dst", amount=AMOUNT
)
DEBIT = DebitAccount(transfer_id="t-1", account_id="src", amount=AMOUNT)
CREDIT = CreditAccount(transfer_id="t-1", account_id="dst", amount=AMOUNT)
REVERSE = ReverseDebit(transfer_id="t-1", account_id="src", amount=AMOUNT)
DEBIT_OK = DebitConfirmed(transfer_id="t-1", account_id="src", amount=AMOUNT)
CREDIT_OK = CreditConfirmed(transfer_id="t-1", account_id="dst", amount=AMOUNT)


def test_start_sends_the_debit_and_schedules_the_default_timeout() -> None:
    fixture = SagaFixture(TransferSaga)
    result = fixture.when(REQUESTED)
    result.expect_commands(DEBIT).expect_active()
    result.expect_deadline_scheduled(PAYMENT_TIMEOUT, after=timedelta(minutes=30))
    result.expect_deadline_scheduled(PAYMENT_TIMEOUT, at=T0 + timedelta(minutes=30))
    result.expect_state(transfer_id="t-1", amount=AMOUNT, debit_confirmed=False)
    assert result.command_intents[0].topic == "account-commands"
    assert result.command_intents[0].key == "t-1"
    assert fixture.pending_deadlines == {PAYMENT_TIMEOUT: T0 + timedelta(minutes=30)}


def test_happy_path_cancels_the_timeout_credits_and_ends() -> None:
    fixture = SagaFixture(TransferSaga).given(REQUESTED)
    fixture.when_time_elapses(timedelta(minutes=10)).expect_no_commands().expect_active()

    fixture.when(DEBIT_OK).expect_commands(CREDIT).expect_no_deadlines().expect_active()
    # The cancelled timeout must not fire, however long we wait.
    fixture.when_time_elapses(timedelta(hours=2)).expect_no_commands().expect_active()
    result = fixture.when(CREDIT_OK)
    result.expect_no_commands().expect_ended("COMPLETED").expect_no_deadlines()
    result.expect_state(debit_confirmed=True, credit_confirmed=True)


def test_no_confirmation_times_out_reverses_the_debit_and_ends() -> None:
    fixture = SagaFixture(TransferSaga).given(REQUESTED)
    fixture.when_time_elapses(timedelta(minutes=29, seconds=59)).expect_no_commands()
    assert fixture.pending_deadlines == {PAYMENT_TIMEOUT: T0 + timedelta(minutes=30)}

    result = fixture.when_time_elapses(timedelta(seconds=1))
    result.expect_commands(REVERSE).expect_ended("TIMED_OUT").expect_no_deadlines()
    assert result.fired == [PAYMENT_TIMEOUT]
    assert fixture.now == T0 + timedelta(minutes=30)
    assert fixture.pending_deadlines == {}


def test_events_after_the_end_are_ignored_and_recorded() -> None:
    fixture = SagaFixture(TransferSaga).given(REQUESTED)
    fixture.when_time_elapses(timedelta(minutes=30)).expect_ended()

    late = fixture.when(DEBIT_OK)
    assert late.ignored
    late.expect_no_commands().expect_ended().expect_state(debit_confirmed=False)
    restart = fixture.when(REQUESTED)
    assert restart.ignored
    restart.expect_no_commands().expect_no_deadlines()
    assert fixture.ignored == [DEBIT_OK, REQUESTED]


def test_debit_failure_ends_with_nothing_to_undo() -> None:
    fixture = SagaFixture(TransferSaga).given(REQUESTED)
    result = fixture.when(DebitFailed(transfer_id="t-1", account_id="src", reason="funds"))
    result.expect_no_commands().expect_ended("FAILED").expect_no_deadlines()


def test_credit_failure_reverses_the_debit() -> None:
    fixture = SagaFixture(TransferSaga).given(REQUESTED, DEBIT_OK)
    result = fixture.when(CreditFailed(transfer_id="t-1", account_id="dst", reason="closed"))
    result.expect_commands(REVERSE).expect_ended("COMPENSATED")


def test_timeout_is_configurable() -> None:
    fixture = SagaFixture(TransferSaga, settings={"transfer.payment-timeout": "PT5M"})
    fixture.when(REQUESTED).expect_deadline_scheduled(PAYMENT_TIMEOUT, after=timedelta(minutes=5))
    fixture.when_time_elapses(timedelta(minutes=5)).expect_commands(REVERSE).expect_ended()


def test_failed_expectations_explain_themselves() -> None:
    result = SagaFixture(TransferSaga).when(REQUESTED)
    with pytest.raises(AssertionError, match=r"(?s)commands differ.*-.*ReverseDebit"):
        result.expect_commands(REVERSE)
    with pytest.raises(AssertionError, match="expected the saga to have ended"):
        result.expect_ended()
    with pytest.raises(AssertionError, match="expected no pending deadlines"):
        result.expect_no_deadlines()
    with pytest.raises(AssertionError, match="still pending"):
        result.expect_no_deadline(PAYMENT_TIMEOUT)
    with pytest.raises(AssertionError, match="expected 0:10:00"):
        result.expect_deadline_scheduled(PAYMENT_TIMEOUT, after=timedelta(minutes=10))
    with pytest.raises(AssertionError, match="was not scheduled"):
        result.expect_deadline_scheduled("other")
    with pytest.raises(AssertionError, match="state differs"):
        result.expect_state(amount=Decimal(1))
    with pytest.raises(AssertionError, match="no such state field"):
        result.expect_state(colour="red")
    with pytest.raises(AssertionError, match="expected no commands"):
        result.expect_no_commands()


@dataclass
class Bank:
    """A fake account service with the idempotency rules ReverseDebit documents."""

    balances: dict[str, Decimal] = field(
        default_factory=lambda: {"src": Decimal(100), "dst": Decimal(0)}
    )
    debited: set[str] = field(default_factory=set)
    reversed: set[str] = field(default_factory=set)

    def debit(self, cmd: DebitAccount, ok: bool) -> bool:
        if not ok or cmd.transfer_id in self.reversed:
            return False
        self.balances[cmd.account_id] -= cmd.amount
        self.debited.add(cmd.transfer_id)
        return True

    def apply(self, cmd: CreditAccount | ReverseDebit, ok: bool = True) -> bool:
        if isinstance(cmd, ReverseDebit):
            if cmd.transfer_id in self.reversed:
                return True
            self.reversed.add(cmd.transfer_id)
            if cmd.transfer_id not in self.debited:
                return True
        elif not ok:
            return False
        self.balances[cmd.account_id] += cmd.amount
        return True


@settings(max_examples=60, deadline=None, database=None)
@given(
    debit_ok=st.booleans(),
    credit_ok=st.booleans(),
    debit_processed_before_timeout=st.booleans(),
    confirmation_delay=st.integers(min_value=0, max_value=60),
)
def test_money_is_conserved_on_every_path(
    debit_ok: bool, credit_ok: bool, debit_processed_before_timeout: bool, confirmation_delay: int
) -> None:
    bank = Bank()
    fixture = SagaFixture(TransferSaga)
    fixture.when(REQUESTED).expect_commands(DEBIT)
    applied = bank.debit(DEBIT, debit_ok) if debit_processed_before_timeout else None

    for cmd in fixture.when_time_elapses(timedelta(minutes=confirmation_delay)).commands:
        assert isinstance(cmd, ReverseDebit)
        bank.apply(cmd)
    if applied is None:  # the account service only gets to the debit now
        applied = bank.debit(DEBIT, debit_ok)
    reply = DEBIT_OK if applied else DebitFailed(transfer_id="t-1", account_id="src", reason="x")
    for cmd in fixture.when(reply).commands:
        assert isinstance(cmd, CreditAccount)
        if bank.apply(cmd, credit_ok):
            fixture.when(CREDIT_OK)
        else:
            for undo in fixture.when(
                CreditFailed(transfer_id="t-1", account_id="dst", reason="x")
            ).commands:
                assert isinstance(undo, ReverseDebit)
                bank.apply(undo)

    assert fixture.ended
    assert fixture.pending_deadlines == {}
    assert sum(bank.balances.values()) == Decimal(100)
    assert bank.balances in ({"src": 100, "dst": 0}, {"src": 75, "dst": 25})


def test_cancel_before_the_debit_is_confirmed_reverses_it_and_ends() -> None:
    fixture = SagaFixture(TransferSaga)
    fixture.when(REQUESTED)
    result = fixture.when_cancelled("customer called")
    result.expect_commands(REVERSE).expect_ended("CANCELLED").expect_no_deadlines()
    # The debit's late confirmation finds an ended saga: nothing is credited.
    assert fixture.when(DEBIT_OK).ignored


def test_cancel_after_the_credit_was_sent_is_recorded_and_changes_nothing() -> None:
    fixture = SagaFixture(TransferSaga)
    fixture.when(REQUESTED)
    fixture.when(DEBIT_OK)
    result = fixture.when_cancelled("too late").expect_no_commands().expect_active()
    result.expect_state(cancel_refused="credit already sent when saga-fixture cancelled")
    fixture.when(CREDIT_OK).expect_ended("COMPLETED")


def test_a_redelivered_reply_and_a_reply_published_twice_are_duplicates() -> None:
    fixture = SagaFixture(TransferSaga).given(REQUESTED)
    first = fixture.when(DEBIT_OK).expect_commands(CREDIT)
    # The same record again (a consumer that crashed before its commit): nothing more.
    first.redeliver().expect_ignored().expect_no_commands()
    # The reply published twice upstream: two records, one message id.
    fixture.when(CREDIT_OK, message_id="credit-ok-1").expect_ended()
    again = fixture.when(CREDIT_OK, message_id="credit-ok-1")
    again.expect_ignored().expect_no_commands()
    assert fixture.ignored == [DEBIT_OK, CREDIT_OK]
    with pytest.raises(AssertionError, match="only a step that delivered an event"):
        fixture.when_time_elapses(timedelta(seconds=1)).redeliver()


def test_a_reply_is_stamped_with_the_fixtures_virtual_time() -> None:
    from processor._authoring.messages import registry
    from processor.testing._engine import event_record

    fixture = SagaFixture(TransferSaga).given(REQUESTED)
    fixture.when_time_elapses(timedelta(minutes=7))
    meta = fixture._metadata(DEBIT_OK, "t-1", None)
    assert meta.occurred_at == T0 + timedelta(minutes=7)
    record = event_record(DEBIT_OK, meta, registry, 1)
    assert record.timestamp_ms == int((T0 + timedelta(minutes=7)).timestamp() * 1000)
