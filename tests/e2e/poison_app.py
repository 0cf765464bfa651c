"""The app tests/e2e/test_poison_mix.py runs: the transfer saga and a saga that may be unstorable.

`BlobSaga` starts on a `BlobPut` published to the transfer events topic, so that its records
share partitions and batches with the transfers, and ends at once. Its handler keeps values that
pass the model's validation but that no JSON encoder takes when the event asks for them: the
bytes `raw` names (in hex) in a `bytes` field, and "SURROGATE" in `text` as a lone surrogate.
Such a saga is parked with the reason; the batch around it goes on.
"""

from __future__ import annotations

from processor import (
    Message,
    SagaApp,
    SagaLifecycle,
    SagaState,
    message_type,
    saga,
    saga_event_handler,
)
from sagas.transfer import TransferSaga
from schemas.transfers import TRANSFER_EVENTS_TOPIC

BLOB_SAGA = "tests.poison-mix-blob"


@message_type("tests.poison_mix.BlobPut", topic=TRANSFER_EVENTS_TOPIC)
class BlobPut(Message):
    blob_id: str
    text: str = ""
    raw: str = ""  # hex of the bytes to store


@saga(type=BLOB_SAGA)
class BlobSaga(SagaState):
    """Stores what its one event carries, and ends."""

    blob_id: str = ""
    text: str = ""
    data: bytes = b""

    @saga_event_handler(BlobPut, association_property="blob_id", start=True)
    def put(self, event: BlobPut, lifecycle: SagaLifecycle) -> None:
        self.blob_id = event.blob_id
        self.text = event.text.replace("SURROGATE", "\udc80")
        self.data = bytes.fromhex(event.raw)
        lifecycle.end()


app = SagaApp(sagas=[TransferSaga, BlobSaga])
