"""Example sagas run by the processor and its demo."""

from sagas.order import OrderSaga
from sagas.transfer import TransferSaga
from sagas.wallet import WalletTransferSaga

__all__ = [
    "ALL_SAGAS",
    "EXAMPLE_SAGAS",
    "ORDER_SAGAS",
    "OrderSaga",
    "TransferSaga",
    "WalletTransferSaga",
]

EXAMPLE_SAGAS = (TransferSaga, WalletTransferSaga)
# Kept apart from EXAMPLE_SAGAS so the demo's topics and sagas stay as they are.
ORDER_SAGAS = (OrderSaga,)
ALL_SAGAS = (*EXAMPLE_SAGAS, *ORDER_SAGAS)
