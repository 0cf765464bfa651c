"""Messages of the wallet transfer saga (``sagas.wallet``).

The wallet service publishes events to ``wallet-events`` and consumes commands from
``wallet-commands``. Each event carries the ``transfer_id`` correlation id and everything the next
step needs, so no handler has to look anything up. Each command names its ``step`` so the wallet
service can apply it at most once, keyed by ``(transfer_id, step)``.
"""

from __future__ import annotations

from typing import Literal

from processor import Message, message_type
from schemas.transfers import Amount

__all__ = [
    "WALLET_COMMANDS_TOPIC",
    "WALLET_EVENTS_TOPIC",
    "CompleteTransfer",
    "InitiateTransfer",
    "RefundTransfer",
    "TransferCompleted",
    "TransferFailed",
    "TransferInitiated",
    "TransferRefunded",
    "WalletTransferRequested",
]

WALLET_EVENTS_TOPIC = "wallet-events"
WALLET_COMMANDS_TOPIC = "wallet-commands"


class _WalletTransferFacts(Message):
    # Self-contained payload shared by every event and command of the flow.
    transfer_id: str
    from_wallet_id: str
    to_wallet_id: str
    amount: Amount


@message_type("wallets.WalletTransferRequested", topic=WALLET_EVENTS_TOPIC)
class WalletTransferRequested(_WalletTransferFacts):
    """A customer asked to move money between wallets; starts the saga."""


@message_type("wallets.TransferInitiated", topic=WALLET_EVENTS_TOPIC)
class TransferInitiated(_WalletTransferFacts):
    """The source wallet was debited."""


@message_type("wallets.TransferCompleted", topic=WALLET_EVENTS_TOPIC)
class TransferCompleted(_WalletTransferFacts):
    """The destination wallet was credited; the transfer is done."""


@message_type("wallets.TransferFailed", topic=WALLET_EVENTS_TOPIC)
class TransferFailed(_WalletTransferFacts):
    """The destination cannot receive the money (missing, closed, incompatible).

    A terminal business failure: retrying will not help, the source must be refunded.
    """

    reason: str


@message_type("wallets.TransferRefunded", topic=WALLET_EVENTS_TOPIC)
class TransferRefunded(_WalletTransferFacts):
    """The source wallet was credited back after a failed transfer."""


@message_type("wallets.InitiateTransfer", topic=WALLET_COMMANDS_TOPIC)
class InitiateTransfer(_WalletTransferFacts):
    """Debit the source wallet; answered by TransferInitiated."""

    step: Literal["initiate"] = "initiate"


@message_type("wallets.CompleteTransfer", topic=WALLET_COMMANDS_TOPIC)
class CompleteTransfer(_WalletTransferFacts):
    """Credit the destination wallet; answered by TransferCompleted or TransferFailed."""

    step: Literal["complete"] = "complete"


@message_type("wallets.RefundTransfer", topic=WALLET_COMMANDS_TOPIC)
class RefundTransfer(_WalletTransferFacts):
    """Credit the source wallet back; answered by TransferRefunded.

    A new, forward-only fact: the original debit stays in the history.
    """

    step: Literal["refund"] = "refund"
