"""Example sagas run by the processor and its demo."""

from sagas.transfer import TransferSaga
from sagas.wallet import WalletTransferSaga

__all__ = ["EXAMPLE_SAGAS", "TransferSaga", "WalletTransferSaga"]

EXAMPLE_SAGAS = (TransferSaga, WalletTransferSaga)
