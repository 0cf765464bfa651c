"""An operator's injected event (``saga inject``), turned into the event it stands for.

The request is an operator record (signed, fenced, deduplicated and expired like the others);
once it is judged fresh, the planner runs it through the very step a consumed event takes
(``EventSteps.event``), as an event whose message id is the request's.
"""

from __future__ import annotations

from collections.abc import Sequence

from processor._authoring.messages import HEADER_MESSAGE_TYPE, MessageMetadata, MessageRegistry
from processor._engine.decode import Event, Operator, injected
from processor._engine.rows import HistoryRow
from processor._engine.working import Item, Working
from processor._wire import HEADER_OPERATOR_AUTH

__all__ = ["as_event", "name_operator"]


def as_event(registry: MessageRegistry, w: Working, item: Item, op: Operator) -> Item | str:
    """The injected event as an item for ``w``, or why the request is refused.

    Refused when the type is unknown or the value does not validate (the reason names the
    fields, never a value), when the saga handles no such event, or when the event's
    association value names another saga.
    """
    req = op.request
    name = req.name or ""
    message = injected(registry, name, req.message or "null")
    if isinstance(message, str):
        return message
    handler = w.bound.definition.event_handlers.get(type(message))
    if handler is None:
        return f"{w.bound.saga_type} handles no {name}"
    if w.bound.definition.association_value(message) != w.saga_id:
        return f"its {handler.association_property} names another saga"
    record = op.record
    # What the handler sees: the request's headers under the injected type, without the
    # signature (which authorises the request, not the event).
    headers = {k: v for k, v in record.headers_text().items() if k != HEADER_OPERATOR_AUTH}
    headers[HEADER_MESSAGE_TYPE] = name
    metadata = MessageMetadata(
        message_id=item.message_id,
        message_type=name,
        correlation_id=None,
        causation_id=None,
        occurred_at=None,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=req.saga_id,
        headers=headers,
    )
    return Item(Event(record, message, metadata), w.bound, w.saga_id)


def name_operator(rows: Sequence[HistoryRow], item: Item, label: str) -> None:
    """Puts who injected the event, and why, in front of its history row's detail."""
    for row in rows:
        if row.message_id == item.message_id:
            row.detail = f"{label} ({row.detail})"[:2000] if row.detail else label
