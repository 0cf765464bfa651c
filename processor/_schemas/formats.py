"""Wire formats, subject naming, and Confluent's framing of a registry-encoded value."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "MAGIC",
    "SubjectNaming",
    "TopicFormat",
    "WireFormat",
    "frame_header",
    "read_frame",
    "subject",
]

MAGIC = 0
"""The first byte of a registry-framed value (then the schema id, 4 bytes big-endian)."""

_ID = struct.Struct(">bI")


class WireFormat(StrEnum):
    """How the values of a topic are written.

    ``json``: the processor's own (the message's JSON, its type and id in headers). The others
    are Confluent's wire format: a zero byte, the schema's registry id in 4 bytes, then the
    value in JSON (``json-schema``), Avro binary (``avro``) or Protobuf (``protobuf``, after the
    message indexes).
    """

    JSON = "json"
    JSON_SCHEMA = "json-schema"
    AVRO = "avro"
    PROTOBUF = "protobuf"

    @property
    def registry_type(self) -> str:
        """The schema type the registry's API names."""
        return {"json-schema": "JSON", "avro": "AVRO", "protobuf": "PROTOBUF"}[self.value]


class SubjectNaming(StrEnum):
    """Under which subject a topic's schema is registered (Confluent's naming strategies).

    ``topic``: ``<topic>-value``, one schema (and its versions) per topic. ``record``: the
    record's full name, shared by every topic it is sent on. ``topic-record``:
    ``<topic>-<record>``, several message types on one topic each with its own history.
    """

    TOPIC = "topic"
    RECORD = "record"
    TOPIC_RECORD = "topic-record"


def subject(naming: SubjectNaming, topic: str, record: str) -> str:
    """The subject a value of record ``record`` on ``topic`` is registered under."""
    if naming is SubjectNaming.TOPIC:
        return f"{topic}-value"
    if naming is SubjectNaming.RECORD:
        return record
    return f"{topic}-{record}"


@dataclass(frozen=True, slots=True)
class TopicFormat:
    """A topic's wire format, and where a record without our headers keeps its id.

    Attributes:
        format: How the topic's values are written.
        id_field: The field of the value that is the message id, for records that carry no
            ``message-id`` header; None: the record's coordinates (topic, partition, offset).
    """

    format: WireFormat = WireFormat.JSON
    id_field: str | None = None


def frame_header(schema_id: int) -> bytes:
    """The five bytes in front of a registry-encoded value."""
    return _ID.pack(MAGIC, schema_id)


def read_frame(value: bytes) -> tuple[int, bytes] | None:
    """The schema id and the encoded value after it; None when ``value`` is not framed."""
    if len(value) < _ID.size or value[0] != MAGIC:
        return None
    return _ID.unpack_from(value)[1], value[_ID.size :]
