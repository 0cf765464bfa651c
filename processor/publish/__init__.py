"""Publishing domain events the way the processor reads them.

Services that feed sagas send events with the headers the processor reads (``message-id``,
``message-type``, ``schema-version``, ``correlation-id``, ``occurred-at``, the W3C trace
context), keyed by the saga's id so that one saga's events stay in order on one partition, and
partitioned as the processor's own producers partition (``SAGA_CONSUMER__PARTITIONER``).

- :class:`EventPublisher` produces them directly: ``publish`` queues, ``flush`` waits and
  raises :class:`PublishFailed` naming each record that did not get through.
- :class:`OutboxEventPublisher` writes them to the service's outbox table in the service's own
  transaction; :class:`OutboxRelay` (the processor's relay) publishes what committed.

The modules: :mod:`~processor.publish.records` builds an event's record (topic, key, headers);
:mod:`~processor.publish.kafka` holds the direct publisher, :mod:`~processor.publish.outbox`
the outbox publisher and :mod:`~processor.publish.relay` the relay that runs over its table.
"""

from processor.publish.kafka import EventPublisher, FailedDelivery, PublishFailed
from processor.publish.outbox import OutboxEventPublisher
from processor.publish.records import EventRecordBuilder

# Public before the split though not in __all__; still importable from here.
from processor.publish.records import current_trace_headers as current_trace_headers
from processor.publish.relay import OutboxRelay

__all__ = [
    "EventPublisher",
    "EventRecordBuilder",
    "FailedDelivery",
    "OutboxEventPublisher",
    "OutboxRelay",
    "PublishFailed",
]
