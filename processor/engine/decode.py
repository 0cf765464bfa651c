"""Turns a raw record into an event, a fired deadline, or a rejection with its reason.

Each bad record is judged once, here, so a record that can never be decoded is dead-lettered
instead of being re-read forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from pydantic import ValidationError

from processor.engine.records import Record
from processor.errors import UnknownMessageType
from processor.messages import Message, MessageMetadata, MessageRegistry
from processor.wire import (
    DEADLINE_FIRED,
    HEADER_CAUSATION_ID,
    HEADER_CORRELATION_ID,
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_OCCURRED_AT,
    HEADER_SCHEMA_VERSION,
    FiredRecord,
)

__all__ = ["Decoded", "Event", "FiredDeadline", "Reason", "Rejected", "decode"]


class Reason(StrEnum):
    """Why a record went to the dead-letter topic."""

    OVERSIZED = "oversized"
    UNPARSEABLE = "unparseable"
    UNKNOWN_TYPE = "unknown-type"
    SCHEMA_VIOLATION = "schema-violation"
    MISSING_ASSOCIATION = "missing-association"
    MISSING_MESSAGE_ID = "missing-message-id"
    REFUSED_BY_DATABASE = "refused-by-database"


@dataclass(frozen=True, slots=True)
class Event:
    """A record that holds a known message type, with its metadata from the headers."""

    record: Record
    message: Message
    metadata: MessageMetadata


@dataclass(frozen=True, slots=True)
class FiredDeadline:
    """A record the deadline poller sent to a saga's partition: its deadline came due."""

    record: Record
    saga_type: str
    saga_id: str
    deadline_id: str
    name: str
    token: int


@dataclass(frozen=True, slots=True)
class Rejected:
    """A record that can never be handled, and why; it goes to the dead-letter topic."""

    record: Record
    reason: Reason
    detail: str


Decoded = Event | FiredDeadline | Rejected


def decode(record: Record, registry: MessageRegistry, max_bytes: int) -> Decoded:
    """Classifies one record; never raises for bad input."""
    size = len(record.value or b"") + len(record.key or b"")
    if size > max_bytes:
        return Rejected(record, Reason.OVERSIZED, f"{size} bytes exceeds the limit of {max_bytes}")
    # One pass over the headers instead of one per lookup (the last repeat wins either way).
    headers = record.headers_text()
    type_name = headers.get(HEADER_MESSAGE_TYPE)
    if type_name == DEADLINE_FIRED:
        return _fired(record)
    if not record.value:
        return Rejected(record, Reason.UNPARSEABLE, "the record has no value")
    if type_name is None:
        return Rejected(record, Reason.UNKNOWN_TYPE, f"no {HEADER_MESSAGE_TYPE} header")
    version = _int(headers.get(HEADER_SCHEMA_VERSION))
    try:
        cls = registry.by_name(type_name, version).cls
    except UnknownMessageType:
        where = f" version {version}" if version is not None else ""
        return Rejected(record, Reason.UNKNOWN_TYPE, f"{type_name!r}{where} is not registered")
    message_id = headers.get(HEADER_MESSAGE_ID)
    if not message_id:
        return Rejected(record, Reason.MISSING_MESSAGE_ID, f"no {HEADER_MESSAGE_ID} header")
    try:
        message = cls.model_validate_json(record.value)
    except ValidationError as e:
        return _invalid(record, e)
    metadata = MessageMetadata(
        message_id=message_id,
        message_type=type_name,
        correlation_id=headers.get(HEADER_CORRELATION_ID),
        causation_id=headers.get(HEADER_CAUSATION_ID),
        occurred_at=_datetime(headers.get(HEADER_OCCURRED_AT)),
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key.decode("utf-8", errors="replace") if record.key is not None else None,
        headers=headers,
    )
    return Event(record, message, metadata)


def _invalid(record: Record, error: ValidationError) -> Rejected:
    # Locations and messages only: pydantic's input echo may carry personal data or secrets.
    details = error.errors(include_input=False, include_url=False, include_context=False)
    if any(d["type"] == "json_invalid" for d in details):
        return Rejected(record, Reason.UNPARSEABLE, "the value is not valid JSON")
    text = "; ".join(f"{'.'.join(map(str, d['loc'])) or '<root>'}: {d['msg']}" for d in details)
    return Rejected(record, Reason.SCHEMA_VIOLATION, text[:2000])


def _fired(record: Record) -> Decoded:
    try:
        fired = FiredRecord.parse(record.value)
    except ValueError:
        return Rejected(record, Reason.SCHEMA_VIOLATION, "malformed deadline-fired record")
    return FiredDeadline(
        record=record,
        saga_type=fired.saga_type,
        saga_id=fired.saga_id,
        deadline_id=fired.deadline_id,
        name=fired.name,
        token=fired.token,
    )


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _datetime(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None
