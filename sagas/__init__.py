"""Example sagas run by the processor and its demo."""

from sagas.order import OrderSaga
from sagas.transfer import TransferSaga
from sagas.trip import TripSaga
from sagas.trip_function import trip_function
from sagas.wallet import WalletTransferSaga

__all__ = [
    "ALL_SAGAS",
    "EXAMPLE_SAGAS",
    "FUNCTION_SAGAS",
    "ORDER_SAGAS",
    "TRIP_SAGAS",
    "OrderSaga",
    "TransferSaga",
    "TripSaga",
    "WalletTransferSaga",
    "trip_function",
]

EXAMPLE_SAGAS = (TransferSaga, WalletTransferSaga)
# Kept apart from EXAMPLE_SAGAS so the demo's topics and sagas stay as they are.
ORDER_SAGAS = (OrderSaga,)
# The trip saga written as one function: the demo runs it beside the others.
FUNCTION_SAGAS = (trip_function,)
ALL_SAGAS = (*EXAMPLE_SAGAS, *ORDER_SAGAS, *FUNCTION_SAGAS)
# The trip saga shows the short orchestrated style (docs/sagas.md); the demo does not run it.
TRIP_SAGAS = (TripSaga,)
