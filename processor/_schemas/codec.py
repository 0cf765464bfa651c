"""Registry-framed records in and out, given the schemas the runtime has fetched.

Inside the processor every value is the message's JSON with our headers; this is the edge where
a topic's records are translated from and to Confluent's wire format. A consumed framed record
becomes a record of our JSON (with ``message-type`` and ``message-id`` headers added when the
producer sent none), and a command or reply is framed as its topic says when it is produced.
The database holds our JSON either way, so the console, operators and retries need no registry.

Pure: every registry call is made by :class:`processor._schemas.resolver.SchemaResolver`, which
hands what it learnt to :meth:`Wire.learn` and :meth:`Wire.learn_writer` before the records
that need it are translated.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_json

from processor._authoring.messages import Message, MessageRegistry, MessageType
from processor._engine.records import OutboxRow, Record
from processor._schemas.formats import (
    SubjectNaming,
    TopicFormat,
    WireFormat,
    frame_header,
    read_frame,
    subject,
)
from processor._schemas.generate import avro_schema, json_schema, proto_file, record_name
from processor._wire import HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE, HEADER_SCHEMA_VERSION

__all__ = [
    "HEADER_SCHEMA_ID",
    "RegisteredSchema",
    "Rejection",
    "Wire",
    "WriterSchema",
]

HEADER_SCHEMA_ID = "schema-id"
"""Added to a translated record: the registry id of the schema it was written with."""


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    """A schema as the registry holds it (fetched by id).

    Attributes:
        kind: ``JSON``, ``AVRO`` or ``PROTOBUF`` (the registry's schema type).
        text: The schema text (Protobuf: a base64 ``FileDescriptorProto``, or ``.proto`` text).
        descriptor: Protobuf: the serialized ``FileDescriptorProto``, when the registry was
            asked for it because ``text`` is ``.proto`` text.
    """

    kind: str
    text: str
    descriptor: bytes | None = None


@dataclass(frozen=True, slots=True)
class Rejection:
    """A framed record that cannot be read, and why (a dead-letter reason and its detail)."""

    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class WriterSchema:
    """The schema a message type is written with on a topic, and where it is registered.

    Attributes:
        subject: The registry subject.
        format: The topic's wire format.
        text: The schema text to register.
    """

    subject: str
    format: WireFormat
    text: str


@dataclass(slots=True)
class _Reader:
    """What reading a value of one schema id needs."""

    format: WireFormat
    record: str | None  # the schema's record name, if it has one
    avro: Any = None  # the parsed Avro writer schema
    proto: Any = None  # message classes by index path, from the writer's descriptor


class Wire:
    """Translates records of the topics set to a registry format; every other one is untouched.

    Args:
        topics: Each registry-framed topic's format, by full topic name (prefix included).
        registry: The message types, for their schemas and their names.
        naming: The subject naming strategy for the schemas written.
    """

    def __init__(
        self,
        topics: Mapping[str, TopicFormat],
        registry: MessageRegistry,
        naming: SubjectNaming = SubjectNaming.TOPIC_RECORD,
    ) -> None:
        self._topics = {t: f for t, f in topics.items() if f.format is not WireFormat.JSON}
        self._registry = registry
        self._naming = naming
        self._readers: dict[int, _Reader | None] = {}
        # (topic, type name, version) -> (schema id, encoder)
        self._writers: dict[tuple[str, str, str], tuple[int, _Encoder]] = {}
        self._by_record = _names(registry)

    # -- in ------------------------------------------------------------------------------------

    def unknown_ids(self, records: Iterable[Record]) -> set[int]:
        """The schema ids of framed ``records`` not yet learnt."""
        out: set[int] = set()
        topics = self._topics
        for r in records:
            if r.topic in topics and r.value and r.value[0] == 0:
                frame = read_frame(r.value)
                if frame is not None and frame[0] not in self._readers:
                    out.add(frame[0])
        return out

    def learn(self, schema_id: int, schema: RegisteredSchema | None) -> None:
        """What the registry said of ``schema_id``; None: it holds no schema of that id."""
        self._readers[schema_id] = None if schema is None else _reader(schema)

    def unframe(self, record: Record) -> Record | Rejection | None:
        """``record`` as our JSON; a rejection; None when it is not framed (read as is).

        A record on a framed topic whose value does not start with the zero byte is read as our
        JSON, so a topic can move to a registry format with records of both kinds on it.
        """
        fmt = self._topics.get(record.topic)
        value = record.value
        if fmt is None or not value or value[0] != 0:
            return None
        frame = read_frame(value)
        if frame is None:
            return Rejection("unparseable", "the value is shorter than a registry frame")
        schema_id, payload = frame
        if schema_id not in self._readers:
            # The resolver fetches every id of a batch before it is decoded.
            raise LookupError(f"schema id {schema_id} was not fetched")
        reader = self._readers[schema_id]
        if reader is None:
            return Rejection("unknown-schema", f"schema id {schema_id} is not in the registry")
        if reader.format is not fmt.format:
            return Rejection(
                "unparseable",
                f"schema id {schema_id} is {reader.format.value}, the topic is set to "
                f"{fmt.format.value}",
            )
        try:
            data, record_type = _read(reader, payload)
        except Exception as e:  # any decoder's failure: the record is judged once, here
            return Rejection(
                "unparseable",
                f"the value does not decode with schema id {schema_id}: {type(e).__name__}",
            )
        headers = {k: v.decode("utf-8", "replace") for k, v in record.headers}
        added: list[tuple[str, bytes]] = [(HEADER_SCHEMA_ID, str(schema_id).encode())]
        name = headers.get(HEADER_MESSAGE_TYPE)
        if name is None:
            name = self._by_record.get(record_type or "") or self._by_record.get(
                (record_type or "").rsplit(".", 1)[-1]
            )
            if name is None:
                return Rejection(
                    "unknown-type",
                    f"no message type is registered for record {record_type!r} "
                    f"(schema id {schema_id})",
                )
            added.append((HEADER_MESSAGE_TYPE, name.encode()))
        if HEADER_MESSAGE_ID not in headers:
            if isinstance(data, bytes) and fmt.id_field is not None:
                try:
                    data = json.loads(data)
                except ValueError:
                    return Rejection("unparseable", "the value is not valid JSON")
            added.append((HEADER_MESSAGE_ID, _message_id(record, data, fmt).encode()))
        if not isinstance(data, bytes):
            # Decoded from Avro or Protobuf. Fields the model does not know are left out by
            # decode, only when the model refuses them (see lenient): the common case is
            # validated once.
            data = to_json(data)
        return Record(
            record.topic,
            record.partition,
            record.offset,
            record.key,
            data,
            (*record.headers, *added),
            record.timestamp_ms,
        )

    def lenient(self, cls: type[Message], value: bytes) -> Message | None:
        """``value`` read as ``cls`` without the fields it does not know; None if not JSON.

        For a translated record the model refused only for unknown fields: a registry's
        compatibility rules let a producer add a field before its consumers know it (forward
        compatibility).
        """
        try:
            data = json.loads(value)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        known = {*cls.model_fields, *(f.alias for f in cls.model_fields.values() if f.alias)}
        kept = {k: v for k, v in data.items() if k in known}
        return cls.__pydantic_validator__.validate_json(to_json(kept))  # type: ignore[no-any-return]

    # -- out -----------------------------------------------------------------------------------

    def writer(self, topic: str, type_name: str, version: int | None) -> WriterSchema | None:
        """The schema ``type_name`` is written with on ``topic``; None if the topic is JSON."""
        fmt = self._topics.get(topic)
        if fmt is None:
            return None
        mtype = self._registry.by_name(type_name, version)
        return writer_schema(mtype, topic, fmt.format, self._naming)

    def unregistered(self, rows: Sequence[OutboxRow]) -> list[tuple[str, str, str]]:
        """The (topic, type, version) of framed ``rows`` whose schema id is not yet learnt."""
        out = []
        for row in rows:
            if row.topic in self._topics:
                key = self._row_key(row)
                if key is not None and key not in self._writers:
                    out.append(key)
        return out

    def learn_writer(self, key: tuple[str, str, str], schema_id: int) -> None:
        """The registry id of the schema ``key`` is written with."""
        topic, name, version = key
        mtype = self._registry.by_name(name, int(version) if version else None)
        fmt = self._topics[topic].format
        self._writers[key] = (schema_id, _encoder(mtype, fmt))

    def frame(self, row: OutboxRow) -> bytes:
        """``row``'s value in its topic's format (as is for a JSON topic or a foreign record).

        Raises:
            LookupError: The row's schema id was not learnt (see :meth:`unregistered`).
            ValueError: The value does not fit its schema.
        """
        if row.topic not in self._topics:
            return row.value
        key = self._row_key(row)
        if key is None:
            return row.value  # not a message of ours (a dead letter, a fired deadline)
        schema_id, encode = self._writers[key]
        return frame_header(schema_id) + encode(row.value)

    def _row_key(self, row: OutboxRow) -> tuple[str, str, str] | None:
        name = row.headers.get(HEADER_MESSAGE_TYPE)
        if name is None or name not in self._registry:
            return None
        return (row.topic, name, row.headers.get(HEADER_SCHEMA_VERSION, ""))


# -- reading ------------------------------------------------------------------------------------


def _names(registry: MessageRegistry) -> dict[str, str]:
    """Record names a schema may carry, each to the wire name of its message type.

    The wire name itself, the record name our schemas give it (``a.b.C``) and its last part
    (``C``), unless two types share it.
    """
    out: dict[str, str] = {}
    clashes: set[str] = set()
    for mtype in registry.all():
        namespace, name = record_name(mtype)
        full = f"{namespace}.{name}" if namespace else name
        for alias in {mtype.name, full, name, mtype.cls.__name__}:
            if out.get(alias, mtype.name) != mtype.name:
                clashes.add(alias)
            out[alias] = mtype.name
    for alias in clashes - {m.name for m in registry.all()}:
        del out[alias]
    return out


def _reader(schema: RegisteredSchema) -> _Reader:
    kind = schema.kind.upper()
    if kind == "AVRO":
        import fastavro

        parsed = fastavro.parse_schema(json.loads(schema.text))
        name = parsed.get("name") if isinstance(parsed, dict) else None
        return _Reader(WireFormat.AVRO, name, avro=parsed)
    if kind == "PROTOBUF":
        return _Reader(WireFormat.PROTOBUF, None, proto=_proto_classes(schema))
    # JSON Schema: the record name is its title.
    try:
        title = json.loads(schema.text).get("title")
    except (ValueError, AttributeError):
        title = None
    return _Reader(WireFormat.JSON_SCHEMA, title if isinstance(title, str) else None)


def _proto_classes(schema: RegisteredSchema) -> dict[tuple[int, ...], Any] | None:
    """Message classes of the writer's descriptor, by index path; None when it has none."""
    from google.protobuf import descriptor_pool, message_factory

    fdp = proto_descriptor(schema)
    if fdp is None:
        return None
    try:
        pool = descriptor_pool.DescriptorPool()
        fd = pool.Add(fdp)
    except Exception:  # imports we were not given (schema references)
        return None
    out: dict[tuple[int, ...], Any] = {}

    def walk(descriptors: Any, path: tuple[int, ...]) -> None:
        for i, d in enumerate(descriptors):
            out[(*path, i)] = message_factory.GetMessageClass(d)
            walk(d.nested_types, (*path, i))

    walk([fd.message_types_by_name[m.name] for m in fdp.message_type], ())
    return out


def proto_descriptor(schema: RegisteredSchema) -> Any:
    """The ``FileDescriptorProto`` a Protobuf schema holds, or None.

    Confluent's serializers register it in base64; a registry asked for the serialized form of
    ``.proto`` text returns it in base64 (Confluent's) or as the bytes' code points (Apicurio's).
    """
    from google.protobuf import descriptor_pb2

    raw: list[bytes] = []
    if schema.descriptor is not None:
        raw.append(schema.descriptor)
    with contextlib.suppress(ValueError):
        raw.append(base64.b64decode(schema.text, validate=True))
    for candidate in raw:
        try:
            fdp = descriptor_pb2.FileDescriptorProto.FromString(candidate)
        except Exception:
            continue
        if fdp.message_type:
            return fdp
    return None


def _read(reader: _Reader, payload: bytes) -> tuple[Any, str | None]:
    if reader.format is WireFormat.JSON_SCHEMA:
        return payload, reader.record
    if reader.format is WireFormat.AVRO:
        import fastavro

        data = fastavro.schemaless_reader(io.BytesIO(payload), reader.avro, None)
        return data, reader.record
    path, body = _message_indexes(payload)
    classes = reader.proto
    if not classes or path not in classes:
        raise ValueError("the writer's descriptor is not readable")
    from google.protobuf import json_format

    cls = classes[path]
    message = cls.FromString(body)
    data = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _int64_back(message, data), cls.DESCRIPTOR.full_name


def _int64_back(message: Any, data: dict[str, Any]) -> dict[str, Any]:
    # The JSON mapping writes 64-bit integers as strings; the model's integers want numbers.
    from google.protobuf.descriptor import FieldDescriptor

    wide = {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
    for field in message.DESCRIPTOR.fields:
        value = data.get(field.name)
        if value is None:
            continue
        if field.type in wide:
            data[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not _is_map(field):
            sub = getattr(message, field.name)
            if isinstance(value, list):
                data[field.name] = [_int64_back(m, v) for m, v in zip(sub, value, strict=True)]
            elif isinstance(value, dict):
                data[field.name] = _int64_back(sub, value)
    return data


def _is_map(field: Any) -> bool:
    return bool(field.message_type.GetOptions().map_entry)


def _message_indexes(payload: bytes) -> tuple[tuple[int, ...], bytes]:
    """Confluent's message-index path in front of a Protobuf value (zig-zag varints)."""
    pos = 0

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            if pos >= len(payload):
                raise ValueError("truncated message indexes")
            b = payload[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return (result >> 1) ^ -(result & 1)
            shift += 7

    count = varint()
    if count == 0:
        return (0,), payload[pos:]
    if count < 0 or count > 64:
        raise ValueError("bad message indexes")
    return tuple(varint() for _ in range(count)), payload[pos:]


def _message_id(record: Record, data: Any, fmt: TopicFormat) -> str:
    if fmt.id_field is not None and isinstance(data, dict):
        value = data.get(fmt.id_field)
        if value is not None and not isinstance(value, dict | list):
            return str(value)
    # Stable across redeliveries of this record, so a redelivery is recognised.
    return f"{record.topic}-{record.partition}-{record.offset}"


# -- writing ------------------------------------------------------------------------------------


class _Encoder:
    def __call__(self, value: bytes) -> bytes:
        raise NotImplementedError


class _JsonEncoder(_Encoder):
    def __call__(self, value: bytes) -> bytes:
        return value


class _AvroEncoder(_Encoder):
    def __init__(self, schema: dict[str, Any]) -> None:
        import fastavro

        self._schema = fastavro.parse_schema(schema)

    def __call__(self, value: bytes) -> bytes:
        import fastavro

        out = io.BytesIO()
        fastavro.schemaless_writer(out, self._schema, json.loads(value))
        return out.getvalue()


class _ProtoEncoder(_Encoder):
    def __init__(self, fdp: Any) -> None:
        from google.protobuf import descriptor_pool, message_factory

        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        first = fdp.message_type[0].name
        full = f"{fdp.package}.{first}" if fdp.package else first
        self._cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(full))

    def __call__(self, value: bytes) -> bytes:
        from google.protobuf import json_format

        message = json_format.ParseDict(_no_nulls(json.loads(value)), self._cls())
        # The message-index path [0] (the file's first message), written as one zero byte.
        return b"\x00" + bytes(message.SerializeToString())


def _no_nulls(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _no_nulls(v) for k, v in data.items() if v is not None}
    if isinstance(data, list):
        return [_no_nulls(v) for v in data]
    return data


def _encoder(mtype: MessageType, fmt: WireFormat) -> _Encoder:
    if fmt is WireFormat.AVRO:
        return _AvroEncoder(avro_schema(mtype))
    if fmt is WireFormat.PROTOBUF:
        return _ProtoEncoder(proto_file(mtype))
    return _JsonEncoder()


def writer_schema(
    mtype: MessageType, topic: str, fmt: WireFormat, naming: SubjectNaming
) -> WriterSchema:
    """The schema ``mtype`` is registered with for ``topic`` in ``fmt``, and its subject."""
    namespace, name = record_name(mtype)
    full = f"{namespace}.{name}" if namespace else name
    if fmt is WireFormat.AVRO:
        text = json.dumps(avro_schema(mtype), separators=(",", ":"))
    elif fmt is WireFormat.PROTOBUF:
        text = base64.b64encode(proto_file(mtype).SerializeToString()).decode()
    else:
        text = json_schema(mtype)
        full = mtype.name
    return WriterSchema(subject(naming, topic, full), fmt, text)
