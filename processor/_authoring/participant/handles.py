"""The reply handle a command handler answers with, and how a reply's headers are built.

Every reply carries the command's saga key (record key, ``saga-type``, ``saga-id``), its
correlation id and, as causation id, the command's message id, so a saga finds it and a trace
follows it without the handler knowing any header name.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

from processor._authoring.messages import Message, MessageRegistry
from processor._engine.records import OutboxRow
from processor._errors import SagaError, UnknownMessageType
from processor._wire import (
    HEADER_CORRELATION_ID,
    HEADER_MESSAGE_ID,
    HEADER_SAGA_ID,
    HEADER_SAGA_TYPE,
    HEADER_TRACEPARENT,
    envelope,
)

__all__ = ["Bucket", "Replies", "SkipDelivery", "reply_row"]


def reply_row(
    message: Message,
    command_headers: Mapping[str, str],
    command_key: bytes | None,
    *,
    registry: MessageRegistry,
    topic: str,
    key: str | None = None,
    message_id: str | None = None,
) -> OutboxRow:
    """The outbox row of one reply to a command.

    Args:
        message: The reply.
        command_headers: The command's headers.
        command_key: The command's record key (the saga key).
        registry: Where the reply's type is registered.
        topic: The topic on the broker.
        key: Record key; the command's key by default, else its ``saga-id``.
        message_id: The reply's message id; a new UUID by default.
    """
    mtype = registry.of(type(message))
    command_id = command_headers.get(HEADER_MESSAGE_ID, "")
    headers = envelope(
        message_id=message_id or str(uuid.uuid4()),
        message_type=mtype.name,
        schema_version=mtype.version,
        # No correlation id on the command: the conversation started with it.
        correlation_id=command_headers.get(HEADER_CORRELATION_ID) or command_id,
        causation_id=command_id,
        occurred_at=datetime.now(UTC),
        # The saga key and the trace context are the command's, unchanged.
        saga_type=command_headers.get(HEADER_SAGA_TYPE),
        saga_id=command_headers.get(HEADER_SAGA_ID),
        traceparent=command_headers.get(HEADER_TRACEPARENT),
    )
    record_key = (
        key.encode()
        if key is not None
        else command_key
        if command_key is not None
        else command_headers.get(HEADER_SAGA_ID, "").encode() or None
    )
    return OutboxRow(
        saga_type=command_headers.get(HEADER_SAGA_TYPE),
        saga_id=command_headers.get(HEADER_SAGA_ID) or (record_key or b"").decode() or None,
        topic=topic,
        key=record_key,
        headers=headers,
        value=message.model_dump_json().encode(),
    )


class Bucket(int):
    """A handler parameter: the ``bucket`` value of the command's rows in the service's tables.

    With the participant's tables distributed by bucket over Citus
    (``SAGA_DATABASE__DISTRIBUTED=buckets``), a service table with a ``bucket`` column is
    co-located with the kit's inbox: a row written with the command's bucket, and read back by
    it, sits on the worker of the command's inbox row, so the command's transaction runs there
    alone. Every command of one saga has the same bucket (it follows the record key). 0 on any
    other layout, so a handler that always writes it runs on every layout.
    """


class SkipDelivery(Exception):
    """Raised by a handler to pass over this delivery as if it never arrived.

    The handler's work rolls back and no inbox row is written, so a later delivery of the same
    command (same message id) is handled afresh. For commands addressed to another instance of
    a shared topic, or to simulate a command delayed in transit.
    """


class Replies:
    """Collects the events a command handler answers with; sent once its transaction commits.

    Args:
        command_headers: The command's headers.
        command_key: The command's record key.
        registry: Registry that supplies each reply class's default topic.
        topic_prefix: Prefix of every topic on the broker.
    """

    def __init__(
        self,
        command_headers: Mapping[str, str],
        command_key: bytes | None,
        *,
        registry: MessageRegistry,
        topic_prefix: str = "",
    ) -> None:
        self._headers = command_headers
        self._key = command_key
        self._registry = registry
        self._prefix = topic_prefix
        self.rows: list[OutboxRow] = []

    def send(
        self,
        event: Message,
        *,
        topic: str | None = None,
        key: str | None = None,
        message_id: str | None = None,
    ) -> str:
        """Answer with ``event`` once the command's transaction commits.

        Args:
            event: A registered message.
            topic: Destination (without prefix); the topic registered for the class by default.
            key: Record key; the command's key (the saga key) by default.
            message_id: Fixes the reply's message id, e.g. to answer a retried command with the
                very reply stored for the first one; a new UUID by default.

        Returns:
            The reply's message id.

        Raises:
            SagaError: The event is not a registered Message or no topic is known.
        """
        if not isinstance(event, Message):
            raise SagaError(f"replies.send() takes a Message instance, got {type(event)!r}")
        try:
            registered = self._registry.of(type(event)).topic
        except UnknownMessageType as e:
            raise SagaError(str(e)) from e
        target = topic or registered
        if target is None:
            raise SagaError(f"no topic for {type(event).__qualname__}: pass topic=...")
        row = reply_row(
            event,
            self._headers,
            self._key,
            registry=self._registry,
            topic=self._prefix + target,
            key=key,
            message_id=message_id,
        )
        self.rows.append(row)
        return row.headers[HEADER_MESSAGE_ID]
