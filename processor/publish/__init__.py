"""Publishing domain events the way the processor reads them.

Services that feed sagas send events with the headers the processor reads (``message-id``,
``message-type``, ``schema-version``, ``correlation-id``, ``occurred-at``, the W3C trace
context), keyed by the saga's id so that one saga's events stay in order on one partition, and
partitioned as the processor's own producers partition (``SAGA_CONSUMER__PARTITIONER``).

- :class:`EventPublisher` produces them directly: ``publish`` queues, ``flush`` waits and
  raises :class:`PublishFailed` naming each record that did not get through.
- :class:`OutboxEventPublisher` writes them to the service's outbox table in the service's own
  transaction; :class:`OutboxRelay` (the processor's relay) publishes what committed.

The modules: :mod:`~processor.publish._records` builds an event's record (topic, key, headers);
:mod:`~processor.publish._kafka` holds the direct publisher, :mod:`~processor.publish._outbox`
the outbox publisher and :mod:`~processor.publish._relay` the relay that runs over its table.
"""

from processor._bootstrap.clients import logged as with_client_logging
from processor._errors import UnknownMessageType
from processor.publish._kafka import EventPublisher, FailedDelivery, PublishFailed
from processor.publish._outbox import OutboxEventPublisher
from processor.publish._records import EventRecordBuilder, current_trace_headers
from processor.publish._relay import OutboxRelay

__all__ = [
    "EventPublisher",
    "EventRecordBuilder",
    "FailedDelivery",
    "OutboxEventPublisher",
    "OutboxRelay",
    "PublishFailed",
    "UnknownMessageType",
    "current_trace_headers",
    "with_client_logging",
]
