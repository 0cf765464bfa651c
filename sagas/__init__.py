"""Example sagas run by the processor and its demo."""

from sagas.order import OrderSaga
from sagas.transfer import TransferSaga
from sagas.trip import TripSaga
from sagas.wallet import WalletTransferSaga

__all__ = [
    "ALL_SAGAS",
    "EXAMPLE_SAGAS",
    "ORDER_SAGAS",
    "TRIP_SAGAS",
    "OrderSaga",
    "TransferSaga",
    "TripSaga",
    "WalletTransferSaga",
]

EXAMPLE_SAGAS = (TransferSaga, WalletTransferSaga)
# Kept apart from EXAMPLE_SAGAS so the demo's topics and sagas stay as they are.
ORDER_SAGAS = (OrderSaga,)
ALL_SAGAS = (*EXAMPLE_SAGAS, *ORDER_SAGAS)
# The trip saga shows the short orchestrated style (docs/sagas.md); the demo does not run it.
TRIP_SAGAS = (TripSaga,)
