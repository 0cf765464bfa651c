"""The example application objects: what `saga-processor run sagas.app:app` runs.

`app` runs the demo's sagas; `transfer_app` and `order_app` run one saga each, for the end-to-end
tests that drive one workload. A real service defines one such object in its own module, with
the dependencies its handlers ask for (see `processor.SagaApp`).
"""

from processor import SagaApp
from sagas import EXAMPLE_SAGAS
from sagas.order import OrderSaga
from sagas.transfer import TransferSaga

__all__ = ["app", "order_app", "transfer_app"]

app = SagaApp(sagas=EXAMPLE_SAGAS)
transfer_app = SagaApp(sagas=[TransferSaga])
order_app = SagaApp(sagas=[OrderSaga])
