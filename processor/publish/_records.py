"""Building an event's record the way the processor reads it: topic, key, headers and value.

The headers are those the processor reads (``message-id``, ``message-type``, ``schema-version``,
``correlation-id``, ``occurred-at``, the W3C trace context), and the key is the saga's id, so
that one saga's events stay in order on one partition. Both publishers build their records
here; this module imports no Kafka or PostgreSQL client.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TypedDict, Unpack

from processor._authoring.choices import known_keywords
from processor._authoring.definition import SagaState, definition_of
from processor._authoring.messages import Message, MessageRegistry
from processor._authoring.messages import registry as default_registry
from processor._engine.decode import id_problem
from processor._engine.records import OutboxRow
from processor._wire import (
    HEADER_CAUSATION_ID,
    HEADER_CORRELATION_ID,
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_OCCURRED_AT,
    HEADER_SCHEMA_VERSION,
    HEADER_TRACEPARENT,
    HEADER_TRACESTATE,
    Topics,
    envelope,
)

__all__ = ["EventRecordBuilder", "PublishOptions", "current_trace_headers"]

try:  # the optional extra
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: TraceContextTextMapPropagator | None = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    _PROPAGATOR = None

# Headers the publisher sets from its arguments; given in ``headers=`` they would contradict them.
_RESERVED = {
    HEADER_MESSAGE_ID: "message_id=",
    HEADER_MESSAGE_TYPE: "the message's registration",
    HEADER_SCHEMA_VERSION: "the message's registration",
    HEADER_CORRELATION_ID: "correlation_id=",
    HEADER_CAUSATION_ID: "causation_id=",
    HEADER_OCCURRED_AT: "occurred_at=",
}


class PublishOptions(TypedDict, total=False):
    """How an event is published, beyond the message itself; every key may be left out.

    The keyword arguments of :meth:`EventPublisher.publish`, :meth:`OutboxEventPublisher.publish`
    and :meth:`EventRecordBuilder.build`.

    Attributes:
        key: The record key; by default the association value of the sagas given that handle
            the message's type.
        message_id: A new UUID by default. Give a stable one to publish the same event again (a
            retry): the processor applies one message id once.
        correlation_id: The conversation; the message id by default.
        causation_id: The id of the message that caused this one, if any.
        occurred_at: When it happened (with a time zone); now by default.
        headers: More headers; the active OpenTelemetry span's ``traceparent`` and
            ``tracestate`` are added unless given here.
        topic: The topic on the broker, as is (no prefix added); the message's registered
            topic, prefixed, by default.
    """

    key: str | None
    message_id: str | None
    correlation_id: str | None
    causation_id: str | None
    occurred_at: datetime | None
    headers: Mapping[str, str] | None
    topic: str | None


def current_trace_headers() -> dict[str, str]:
    """``traceparent`` (and ``tracestate``) of the active OpenTelemetry span; empty without one."""
    if _PROPAGATOR is None or not _trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return {k: v for k, v in carrier.items() if k in (HEADER_TRACEPARENT, HEADER_TRACESTATE)}


class EventRecordBuilder:
    """Turns a message into the record the processor reads: topic, key, headers and value.

    Args:
        topic_prefix: Prefix of every topic on the broker (``SAGA_TOPIC_PREFIX``).
        sagas: Saga classes whose association properties give the key of the events they
            handle, when ``key`` is not given.
        registry: Where the messages are registered.
    """

    def __init__(
        self,
        *,
        topic_prefix: str = "",
        sagas: Iterable[type[SagaState]] = (),
        registry: MessageRegistry = default_registry,
    ) -> None:
        self._topics = Topics(topic_prefix)
        self._registry = registry
        self._definitions = [definition_of(s) for s in sagas]

    def key_for(self, message: Message) -> str:
        """The value of the association property of the sagas that handle ``message``.

        Raises:
            ValueError: No saga given handles the message's type, its value is missing or
                empty, or two sagas read different values from it.
        """
        name = self._registry.of(type(message)).name
        handling = [d for d in self._definitions if d.handles(type(message))]
        if not handling:
            raise ValueError(
                f"no saga given handles {name} ({type(message).__qualname__}), so its key is "
                "unknown: pass key=..., or the sagas that handle it in sagas=[...]"
            )
        values = {d.saga_type: d.association_value(message) for d in handling}
        empty = sorted(t for t, v in values.items() if v is None)
        if empty:
            props = {d.event_handlers[type(message)].association_property for d in handling}
            raise ValueError(
                f"{name}: the association property ({', '.join(sorted(map(str, props)))}) of "
                f"saga {', '.join(empty)} is empty; pass key=..."
            )
        distinct = {v for v in values.values() if v is not None}
        if len(distinct) > 1:
            raise ValueError(
                f"{name} is handled by sagas that read different keys from it "
                f"({', '.join(sorted(values))}); pass key=..."
            )
        return distinct.pop()

    def build(self, message: Message, **options: Unpack[PublishOptions]) -> OutboxRow:
        """The record of ``message``, published as ``options`` say (:class:`PublishOptions`).

        The row's ``saga_type`` and ``saga_id`` (what an outbox orders rows by) are the type of
        the first saga given that handles the message (else the topic) and the key.

        Raises:
            UnknownMessageType: The message's class is not registered.
            ValueError: No topic, no key, or an id, key or header the processor would refuse.
            TypeError: A keyword :class:`PublishOptions` does not name.
        """
        known_keywords(options, PublishOptions)
        cls = type(message)
        mtype = self._registry.of(cls)
        topic, key = options.get("topic"), options.get("key")
        message_id, occurred_at = options.get("message_id"), options.get("occurred_at")
        if topic is None:
            if mtype.topic is None:
                raise ValueError(
                    f"{mtype.name} has no topic: register it with @message_type(..., topic=...) "
                    "or pass topic=..."
                )
            topic = self._topics.name(mtype.topic)
        if key is None:
            key = self.key_for(message)
        if message_id is None:
            message_id = str(uuid.uuid4())
        for what, text in (("key", key), ("message id", message_id)):
            problem = id_problem(text) if text else "is empty"
            if problem is not None:
                raise ValueError(f"{mtype.name}: the {what} {problem}")
        extra = dict(options.get("headers") or {})
        for name, text in extra.items():
            if name in _RESERVED:
                raise ValueError(f"header {name!r} is set by the publisher: use {_RESERVED[name]}")
            if "\x00" in name or "\x00" in text:
                raise ValueError(f"header {name!r} holds a NUL character")
        when = occurred_at if occurred_at is not None else datetime.now(UTC)
        if when.tzinfo is None:
            raise ValueError("occurred_at needs a time zone (e.g. datetime.now(UTC))")
        trace = current_trace_headers()
        out = envelope(
            message_id=message_id,
            message_type=mtype.name,
            schema_version=mtype.version,
            # An event nobody caused starts a conversation: its own id names it.
            correlation_id=options.get("correlation_id") or message_id,
            causation_id=options.get("causation_id"),
            occurred_at=when,
            # The caller's own trace context, if given in ``headers``, wins over the active span's.
            traceparent=trace.get(HEADER_TRACEPARENT),
            tracestate=trace.get(HEADER_TRACESTATE),
            extra=extra,
        )
        handling = [d.saga_type for d in self._definitions if d.handles(cls)]
        return OutboxRow(
            saga_type=handling[0] if handling else topic,
            saga_id=key,
            topic=topic,
            key=key.encode(),
            headers=out,
            value=message.model_dump_json().encode(),
        )
