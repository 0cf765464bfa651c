"""Account-to-account transfer with a payment timeout.

Debit the source, then credit the target. If the debit is not confirmed within the payment
timeout, reverse it and stop; if the credit fails, reverse the debit. An operator's
``saga cancel`` before the debit is confirmed reverses it too. Every path ends with the money
either moved once or back where it started.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Annotated

from processor import (
    CancelRequest,
    SagaCommands,
    SagaDeadlines,
    SagaLifecycle,
    SagaOutcome,
    SagaState,
    Setting,
    saga,
    saga_cancel_handler,
    saga_deadline_handler,
    saga_event_handler,
)
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

__all__ = ["DEFAULT_PAYMENT_TIMEOUT", "PAYMENT_TIMEOUT", "TransferSaga"]

PAYMENT_TIMEOUT = "payment-timeout"
DEFAULT_PAYMENT_TIMEOUT = timedelta(minutes=30)

PaymentTimeout = Annotated[
    timedelta, Setting("transfer.payment-timeout", default=DEFAULT_PAYMENT_TIMEOUT)
]


@saga(type="transfer-saga")
class TransferSaga(SagaState):
    """Moves money between two accounts through the account service."""

    # Empty until the start handler copies them from TransferRequested; a new instance must be
    # constructible without arguments.
    transfer_id: str = ""
    source_account_id: str = ""
    target_account_id: str = ""
    amount: Decimal = Decimal(0)
    debit_confirmed: bool = False
    credit_confirmed: bool = False
    cancel_refused: str | None = None

    @saga_event_handler(TransferRequested, association_property="transfer_id", start=True)
    def on_requested(
        self,
        event: TransferRequested,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        timeout: PaymentTimeout,
    ) -> None:
        """Debit the source and start the payment timeout."""
        self.transfer_id = event.transfer_id
        self.source_account_id = event.source_account_id
        self.target_account_id = event.target_account_id
        self.amount = event.amount
        commands.send(
            DebitAccount(
                transfer_id=event.transfer_id,
                account_id=event.source_account_id,
                amount=event.amount,
            )
        )
        deadlines.schedule(PAYMENT_TIMEOUT, timeout)

    @saga_event_handler(DebitConfirmed, association_property="transfer_id")
    def on_debit_confirmed(
        self, event: DebitConfirmed, commands: SagaCommands, deadlines: SagaDeadlines
    ) -> None:
        """Credit the target; the timeout no longer applies once the money has left."""
        self.debit_confirmed = True
        commands.send(self._credit())
        deadlines.cancel(PAYMENT_TIMEOUT)

    @saga_event_handler(DebitFailed, association_property="transfer_id")
    def on_debit_failed(self, event: DebitFailed, lifecycle: SagaLifecycle) -> None:
        """Nothing moved, so there is nothing to undo."""
        lifecycle.end(SagaOutcome.FAILED)

    @saga_event_handler(CreditConfirmed, association_property="transfer_id")
    def on_credit_confirmed(self, event: CreditConfirmed, lifecycle: SagaLifecycle) -> None:
        """Finish once both legs are confirmed."""
        self.credit_confirmed = True
        if self.debit_confirmed and self.credit_confirmed:
            lifecycle.end()

    @saga_event_handler(CreditFailed, association_property="transfer_id")
    def on_credit_failed(
        self, event: CreditFailed, commands: SagaCommands, lifecycle: SagaLifecycle
    ) -> None:
        """The target refused the money: give it back to the source.

        COMPENSATED, not FAILED: the debit is undone. The reversal is sent in the same
        transaction as the end, and the account service never refuses one (it returns money
        this transfer took).
        """
        commands.send(self._reverse_debit())
        lifecycle.end(SagaOutcome.COMPENSATED)

    @saga_deadline_handler(PAYMENT_TIMEOUT)
    def on_payment_timeout(self, commands: SagaCommands, lifecycle: SagaLifecycle) -> None:
        """No debit confirmation in time: reverse whatever may have been debited."""
        commands.send(self._reverse_debit())
        lifecycle.end(SagaOutcome.TIMED_OUT)

    @saga_cancel_handler()
    def on_cancel(
        self, request: CancelRequest, commands: SagaCommands, lifecycle: SagaLifecycle
    ) -> None:
        """An operator cancelled: give the debit back, unless the credit is already on its way.

        Before the debit is confirmed the reversal is safe whatever happens to the debit (the
        account service applies both in order). Once the credit is sent, reversing the debit
        could pay the money out twice, so the transfer finishes as its replies say.
        """
        if self.debit_confirmed:
            self.cancel_refused = f"credit already sent when {request.by} cancelled"
            return
        commands.send(self._reverse_debit())
        lifecycle.end()

    def _credit(self) -> CreditAccount:
        return CreditAccount(
            transfer_id=self.transfer_id, account_id=self.target_account_id, amount=self.amount
        )

    def _reverse_debit(self) -> ReverseDebit:
        return ReverseDebit(
            transfer_id=self.transfer_id, account_id=self.source_account_id, amount=self.amount
        )
