"""Wallet transfer as a saga: debit, then credit, with a forward-only refund.

Each step is driven by the committed event of the previous one. A failed credit is answered
with a new refund step rather than an undo, so the event history reads exactly what happened:
initiated, failed, refunded.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

from pydantic import Field

from processor import (
    SagaCommands,
    SagaLifecycle,
    SagaOutcome,
    SagaState,
    saga,
    saga_event_handler,
)
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

__all__ = ["Step", "WalletTransferSaga"]

Step = Literal["requested", "initiated", "completed", "failed", "refunded"]


@saga(type="wallet-transfer")
class WalletTransferSaga(SagaState):
    """Moves money between wallets through the wallet service."""

    transfer_id: str = ""
    from_wallet_id: str = ""
    to_wallet_id: str = ""
    amount: Decimal = Decimal(0)
    failure_reason: str | None = None
    # Facts observed, in order; only ever appended to, like the event log it mirrors.
    history: list[Step] = Field(default_factory=list)

    @saga_event_handler(WalletTransferRequested, association_property="transfer_id", start=True)
    def on_requested(self, event: WalletTransferRequested, commands: SagaCommands) -> None:
        """Debit the source wallet."""
        self.transfer_id = event.transfer_id
        self.from_wallet_id = event.from_wallet_id
        self.to_wallet_id = event.to_wallet_id
        self.amount = event.amount
        self.history = [*self.history, "requested"]
        commands.send(InitiateTransfer(**self._facts()))

    @saga_event_handler(TransferInitiated, association_property="transfer_id")
    def on_initiated(self, event: TransferInitiated, commands: SagaCommands) -> None:
        """The source is debited: credit the destination."""
        self.history = [*self.history, "initiated"]
        commands.send(CompleteTransfer(**self._facts()))

    @saga_event_handler(TransferCompleted, association_property="transfer_id", end=True)
    def on_completed(self, event: TransferCompleted) -> None:
        """Money arrived; done."""
        self.history = [*self.history, "completed"]

    @saga_event_handler(TransferFailed, association_property="transfer_id")
    def on_failed(self, event: TransferFailed, commands: SagaCommands) -> None:
        """The destination cannot take the money: refund the source as a new step."""
        self.failure_reason = event.reason
        self.history = [*self.history, "failed"]
        commands.send(RefundTransfer(**self._facts()))

    @saga_event_handler(TransferRefunded, association_property="transfer_id")
    def on_refunded(self, event: TransferRefunded, lifecycle: SagaLifecycle) -> None:
        """The source has its money back; done.

        COMPENSATED when the source had been debited (the refund undid it); FAILED when the
        debit itself was refused, so the refund found nothing to give back.
        """
        self.history = [*self.history, "refunded"]
        debited = "initiated" in self.history
        lifecycle.end(SagaOutcome.COMPENSATED if debited else SagaOutcome.FAILED)

    def _facts(self) -> dict[str, object]:
        return {
            "transfer_id": self.transfer_id,
            "from_wallet_id": self.from_wallet_id,
            "to_wallet_id": self.to_wallet_id,
            "amount": self.amount,
        }
