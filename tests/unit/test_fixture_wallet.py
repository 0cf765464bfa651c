"""Seed 004's wallet transfer as a saga: forward-only compensation, honest history."""

from decimal import Decimal

from processor.testing import SagaFixture
from sagas.wallet import WalletTransferSaga
from schemas.wallets import (
    CompleteTransfer,
    InitiateTransfer,
    RefundTransfer,
    TransferCompleted,
    TransferFailed,
    TransferInitiated,
    TransferRefunded,
    WalletTransferRequested,
)

FACTS = {
    "transfer_id": "w-1",
    "from_wallet_id": "alice",
    "to_wallet_id": "bob",
    "amount": Decimal("12.50"),
}


def test_happy_path_initiates_then_completes() -> None:
    fixture = SagaFixture(WalletTransferSaga)
    first = fixture.when(WalletTransferRequested(**FACTS))
    first.expect_commands(InitiateTransfer(**FACTS)).expect_active()
    assert first.command_intents[0].topic == "wallet-commands"
    fixture.when(TransferInitiated(**FACTS)).expect_commands(CompleteTransfer(**FACTS))
    done = fixture.when(TransferCompleted(**FACTS))
    done.expect_no_commands().expect_ended("COMPLETED").expect_no_deadlines()
    done.expect_state(history=["requested", "initiated", "completed"], failure_reason=None)


def test_failed_credit_is_refunded_as_a_new_step() -> None:
    fixture = SagaFixture(WalletTransferSaga).given(
        WalletTransferRequested(**FACTS), TransferInitiated(**FACTS)
    )
    failed = fixture.when(TransferFailed(**FACTS, reason="wallet closed"))
    failed.expect_commands(RefundTransfer(**FACTS)).expect_active()
    fixture.when(TransferRefunded(**FACTS)).expect_ended("COMPENSATED").expect_state(
        history=["requested", "initiated", "failed", "refunded"], failure_reason="wallet closed"
    )


def test_a_refused_debit_has_nothing_to_refund_and_ends_failed() -> None:
    fixture = SagaFixture(WalletTransferSaga).given(WalletTransferRequested(**FACTS))
    fixture.when(TransferFailed(**FACTS, reason="insufficient funds")).expect_commands(
        RefundTransfer(**FACTS)
    )
    fixture.when(TransferRefunded(**FACTS)).expect_ended("FAILED")


def test_each_command_names_its_step_for_idempotency_keys() -> None:
    steps = [
        cmd.step
        for cmd in (InitiateTransfer(**FACTS), CompleteTransfer(**FACTS), RefundTransfer(**FACTS))
    ]
    assert steps == ["initiate", "complete", "refund"]
    assert RefundTransfer(**FACTS).model_dump(mode="json")["step"] == "refund"


def test_late_events_after_completion_are_ignored() -> None:
    fixture = SagaFixture(WalletTransferSaga).given(
        WalletTransferRequested(**FACTS), TransferInitiated(**FACTS), TransferCompleted(**FACTS)
    )
    late = fixture.when(TransferFailed(**FACTS, reason="duplicate delivery"))
    assert late.ignored
    late.expect_no_commands().expect_state(failure_reason=None)


def test_sagas_are_keyed_by_transfer_id() -> None:
    fixture = SagaFixture(WalletTransferSaga, saga_id="w-1")
    fixture.when(WalletTransferRequested(**FACTS))
    other = {**FACTS, "transfer_id": "w-2"}
    result = fixture.when(WalletTransferRequested(**other))
    assert result.saga_id == "w-2"
    result.expect_commands(InitiateTransfer(**other))
    assert fixture.state is not None
    assert fixture.state.model_dump()["transfer_id"] == "w-1"
    # An event for a transfer that never started is recorded and ignored.
    stray = fixture.when(TransferInitiated(**{**FACTS, "transfer_id": "w-3"}))
    assert stray.ignored
    assert stray.state is None
