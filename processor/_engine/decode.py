"""Turns a raw record into an event, a fired deadline, or a rejection with its reason.

Each bad record is judged once, here, so a record that can never be decoded is dead-lettered
instead of being re-read forever.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from processor._authoring.messages import Message, MessageMetadata, MessageRegistry
from processor._engine.limits import (
    MAX_HEADER_VALUE_BYTES,
    MAX_ID_BYTES,
    escaped_nul,
    id_problem,
    key_problem,
)
from processor._engine.records import UNREADABLE_HEADER_NAME, Record
from processor._engine.rows import DeadLetter
from processor._errors import UnknownMessageType
from processor._wire import (
    DEADLINE_FIRED,
    HEADER_CAUSATION_ID,
    HEADER_CORRELATION_ID,
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_OCCURRED_AT,
    HEADER_OPERATOR_AUTH,
    HEADER_SCHEMA_VERSION,
    OPERATOR_COMMAND,
    FiredRecord,
    OperatorRecord,
)

if TYPE_CHECKING:
    from processor._schemas.codec import Wire

__all__ = [
    "MAX_HEADER_VALUE_BYTES",
    "MAX_ID_BYTES",
    "Decoded",
    "Event",
    "FiredDeadline",
    "Operator",
    "Reason",
    "Rejected",
    "TooNew",
    "decode",
    "id_problem",
    "injected",
]


class Reason(StrEnum):
    """Why a record went to the dead-letter topic."""

    OVERSIZED = "oversized"
    UNPARSEABLE = "unparseable"
    UNKNOWN_TYPE = "unknown-type"
    # A registry-framed record whose schema id the registry does not hold.
    UNKNOWN_SCHEMA = "unknown-schema"
    SCHEMA_VIOLATION = "schema-violation"
    MISSING_ASSOCIATION = "missing-association"
    MISSING_MESSAGE_ID = "missing-message-id"
    INVALID_ID = "invalid-id"
    INVALID_HEADER = "invalid-header"
    INVALID_TEXT = "invalid-text"
    REFUSED_BY_DATABASE = "refused-by-database"
    UNAUTHENTICATED = "unauthenticated"
    # A signed operator record that is not where its saga's records are: keyed by something
    # else than its saga id, or on a partition the id does not map to (a copy sent elsewhere).
    MISPLACED = "misplaced"


# Not frozen: a frozen dataclass sets each field through object.__setattr__ (about 0.1 us a
# field), and one is built per event; nothing changes it once built.
@dataclass(slots=True)
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
class Operator:
    """An operator's request for one saga; its signature is checked when it is routed."""

    record: Record
    request: OperatorRecord
    signature: str | None


@dataclass(frozen=True, slots=True)
class Rejected(DeadLetter):
    """A record that can never be handled, and why; it goes to the dead-letter topic."""

    reason: Reason


@dataclass(frozen=True, slots=True)
class TooNew:
    """A record of a known message type at a schema version newer than the code knows.

    It is not dead-lettered: the planner parks it behind its saga, so that a producer deployed
    before the processor loses nothing; once code that knows the version runs, an operator's
    retry (``saga-processor retry``) replays it in order. Without the class there is no
    association property to read, so it is routed by rule (see ``Router.route``): the field
    that the newest known version's handler associates by, read from the raw JSON, else the
    record key.

    Attributes:
        record: The record.
        metadata: Its headers as metadata.
        version: The record's schema version.
        known: The newest version the code has a class for.
        data: The value parsed as JSON (any JSON value).
    """

    record: Record
    metadata: MessageMetadata
    version: int
    known: int
    data: object


Decoded = Event | FiredDeadline | Operator | TooNew | Rejected


def decode(
    record: Record, registry: MessageRegistry, max_bytes: int, wire: Wire | None = None
) -> Decoded:
    """Classifies one record; never raises for bad input.

    With ``wire``, a record of a registry-framed topic is first translated to our JSON (its
    schema fetched beforehand, see ``SchemaResolver.prepare_in``); the event then carries the
    translated record, and a record that cannot be translated is rejected as it came.
    """
    size = len(record.value or b"") + len(record.key or b"")
    if size > max_bytes:
        return Rejected(record, Reason.OVERSIZED, f"{size} bytes exceeds the limit of {max_bytes}")
    original = record
    if wire is not None:
        translated = wire.unframe(record)
        if translated is not None:
            if not isinstance(translated, Record):
                return Rejected(record, Reason(translated.reason), translated.detail)
            size = len(translated.value or b"") + len(record.key or b"")
            if size > max_bytes:
                detail = f"{size} bytes as JSON exceeds the limit of {max_bytes}"
                return Rejected(record, Reason.OVERSIZED, detail)
            record = translated
    # One pass over the headers instead of one per lookup (the last repeat wins either way);
    # the same pass refuses text that PostgreSQL cannot store.
    headers = _headers(record)
    if isinstance(headers, Rejected):
        return headers
    bad_key = key_problem(record.key)
    if bad_key is not None:
        return Rejected(record, Reason.INVALID_ID, f"the record key {bad_key}")
    type_name = headers.get(HEADER_MESSAGE_TYPE)
    if type_name == DEADLINE_FIRED:
        return _fired(record)
    if type_name == OPERATOR_COMMAND:
        return _operator(record, headers.get(HEADER_OPERATOR_AUTH))
    if not record.value:
        return Rejected(record, Reason.UNPARSEABLE, "the record has no value")
    if type_name is None:
        return Rejected(record, Reason.UNKNOWN_TYPE, f"no {HEADER_MESSAGE_TYPE} header")
    version = _int(headers.get(HEADER_SCHEMA_VERSION))
    upcasters: list[Callable[[dict[str, Any]], dict[str, Any]]] = []
    newest: int | None = None
    try:
        cls: type[Message] | None = registry.by_name(type_name, version).cls
    except UnknownMessageType:
        cls = None
        newest = registry.newest_version(type_name)
        path = registry.upcast_path(type_name, version) if version is not None else None
        if path is not None:
            cls, upcasters = path[0].cls, path[1]
        elif newest is None or version is None or version < newest:
            where = f" version {version}" if version is not None else ""
            how = "" if newest is None else " and no upcaster leads from it to a known version"
            return Rejected(
                record, Reason.UNKNOWN_TYPE, f"{type_name!r}{where} is not registered{how}"
            )
    message_id = headers.get(HEADER_MESSAGE_ID)
    if not message_id:
        return Rejected(record, Reason.MISSING_MESSAGE_ID, f"no {HEADER_MESSAGE_ID} header")
    bad_id = id_problem(message_id)
    if bad_id is not None:
        return Rejected(record, Reason.INVALID_ID, f"the {HEADER_MESSAGE_ID} {bad_id}")
    value = record.value
    # jsonb refuses the NUL character; a raw NUL byte is no valid JSON either.
    if b"\x00" in value or (b"\\u0000" in value and escaped_nul(value)):
        return Rejected(record, Reason.INVALID_TEXT, "the value holds a NUL character")
    if cls is None:
        assert newest is not None
        assert version is not None
        try:
            data = json.loads(value)
        except ValueError:
            return Rejected(record, Reason.UNPARSEABLE, "the value is not valid JSON")
        return TooNew(
            record, _metadata(record, type_name, message_id, headers), version, newest, data
        )
    try:
        # The validator model_validate_json() calls, without its wrapper's argument checks.
        message = (
            _upcast(cls, value, upcasters)
            if upcasters
            else cls.__pydantic_validator__.validate_json(value)
        )
    except ValidationError as e:
        # A registry record whose producer added a field this model does not know yet.
        lenient = (
            _lenient(wire, cls, value, e) if wire is not None and record is not original else None
        )
        if lenient is None:
            return _invalid(record, e)
        message = lenient
    except Exception as e:  # an upcaster's own failure: the record is judged once, here
        detail = f"upcaster of {type_name!r} v{version} failed: {type(e).__name__}: {e}"
        return Rejected(record, Reason.SCHEMA_VIOLATION, detail[:2000])
    return Event(record, message, _metadata(record, type_name, message_id, headers))


def _lenient(
    wire: Wire, cls: type[Message], value: bytes, error: ValidationError
) -> Message | None:
    if any(d["type"] != "extra_forbidden" for d in error.errors(include_input=False)):
        return None
    try:
        return wire.lenient(cls, value)
    except ValidationError:
        return None


def _upcast(
    cls: type[Message], value: bytes, chain: list[Callable[[dict[str, Any]], dict[str, Any]]]
) -> Message:
    data = json.loads(value)
    for func in chain:
        data = func(data)
    # Back through JSON, so the upcast payload is validated exactly as a current one would be
    # (JSON mode: strings for decimals and datetimes, the same strictness).
    return cls.model_validate_json(json.dumps(data))


def _metadata(
    record: Record, type_name: str, message_id: str, headers: dict[str, str]
) -> MessageMetadata:
    # MessageMetadata is frozen for the handlers that receive it; its generated __init__ sets
    # each field through object.__setattr__ (about 0.15 us a field, once per event). Filling the
    # new instance's __dict__ directly makes the same object (it has no __post_init__; a unit
    # test checks that every field is set here).
    metadata = _new(MessageMetadata)
    metadata.__dict__.update(
        message_id=message_id,
        message_type=type_name,
        correlation_id=headers.get(HEADER_CORRELATION_ID),
        causation_id=headers.get(HEADER_CAUSATION_ID),
        occurred_at=_datetime(headers.get(HEADER_OCCURRED_AT)),
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key.decode() if record.key is not None else None,
        headers=headers,
    )
    return metadata


_new = object.__new__


def _invalid(record: Record, error: ValidationError) -> Rejected:
    text = _problems(error)
    if text is None:
        return Rejected(record, Reason.UNPARSEABLE, "the value is not valid JSON")
    return Rejected(record, Reason.SCHEMA_VIOLATION, text)


def _problems(error: ValidationError) -> str | None:
    """The fields at fault and what is wrong with them, in one line; None for invalid JSON."""
    # Locations and messages only: pydantic's input echo may carry personal data or secrets.
    details = error.errors(include_input=False, include_url=False, include_context=False)
    if any(d["type"] == "json_invalid" for d in details):
        return None
    text = "; ".join(f"{'.'.join(map(str, d['loc'])) or '<root>'}: {d['msg']}" for d in details)
    return text[:2000]


def injected(registry: MessageRegistry, name: str, value: str | bytes) -> Message | str:
    """The message an operator injects (``name``'s newest version), or why it is refused.

    Validated as a consumed record's value is; the reason names the fields at fault and never
    echoes a value.
    """
    try:
        cls = registry.by_name(name).cls
    except UnknownMessageType:
        return f"no message type {name!r} is registered"
    try:
        message: Message = cls.__pydantic_validator__.validate_json(value)
    except ValidationError as e:
        problems = _problems(e)
        if problems is None:
            return "the value is not valid JSON"
        return " ".join(f"{name}: {problems}".split())
    return message


_Own = TypeVar("_Own", FiredRecord, OperatorRecord)

# Of each record the processor writes itself: what it is, whose ids it names, and each id's
# description and field.
_Ids = tuple[str, str, tuple[tuple[str, str], ...]]
_FIRED_IDS: _Ids = ("deadline-fired", "deadline's", (("saga id", "saga_id"), ("name", "name")))
_OPERATOR_IDS: _Ids = (
    "operator",
    "operator record's",
    (("saga id", "saga_id"), ("command id", "command_id")),
)


def _own(record: Record, parse: Callable[[bytes | None], _Own], ids: _Ids) -> _Own | Rejected:
    """A record the processor writes itself, parsed, with the ids it names checked as ids."""
    kind, whose, fields = ids
    try:
        parsed = parse(record.value)
    except ValueError:
        return Rejected(record, Reason.SCHEMA_VIOLATION, f"malformed {kind} record")
    for what, name in fields:
        problem = id_problem(getattr(parsed, name))
        if problem is not None:
            return Rejected(record, Reason.INVALID_ID, f"the {whose} {what} {problem}")
    return parsed


def _fired(record: Record) -> Decoded:
    fired = _own(record, FiredRecord.parse, _FIRED_IDS)
    if isinstance(fired, Rejected):
        return fired
    try:
        # The deadline table's id is a uuid; anything else can match no row.
        deadline_id = str(uuid.UUID(fired.deadline_id))
    except ValueError:
        return Rejected(record, Reason.SCHEMA_VIOLATION, "the deadline id is not a uuid")
    return FiredDeadline(
        record=record,
        saga_type=fired.saga_type,
        saga_id=fired.saga_id,
        deadline_id=deadline_id,
        name=fired.name,
        token=fired.token,
    )


def _operator(record: Record, signature: str | None) -> Decoded:
    request = _own(record, OperatorRecord.parse, _OPERATOR_IDS)
    if isinstance(request, Rejected):
        return request
    return Operator(record, request, signature)


# A header value of at most this many characters is within MAX_HEADER_VALUE_BYTES whatever
# they are (UTF-8 takes at most 4 bytes a character).
_SHORT_HEADER = MAX_HEADER_VALUE_BYTES // 4


def _headers(record: Record) -> dict[str, str] | Rejected:
    # The common case in a few C-level passes over all headers at once: each decodes, and no
    # name repeats, holds a NUL character (a NUL byte is U+0000 in UTF-8 and nothing else) or
    # is long. Anything else takes the header-by-header path, which names the header at fault.
    pairs = record.headers
    try:
        out = {name: raw.decode() for name, raw in pairs}
    except UnicodeDecodeError:
        return _each_header(record)
    text = "".join(out.values())
    if (
        len(out) == len(pairs)
        and len(text) <= _SHORT_HEADER  # so is each value
        and "\x00" not in text
        and "\x00" not in "".join(out)
    ):
        return out
    return _each_header(record)


def _each_header(record: Record) -> dict[str, str] | Rejected:
    out: dict[str, str] = {}
    for name, raw in record.headers:
        if name == UNREADABLE_HEADER_NAME:
            return Rejected(record, Reason.INVALID_HEADER, "a header name is not valid UTF-8")
        if "\x00" in name:
            return Rejected(record, Reason.INVALID_HEADER, "a header name holds a NUL character")
        if b"\x00" in raw:
            return Rejected(record, Reason.INVALID_HEADER, f"header {name!r} holds a NUL character")
        if len(raw) > MAX_HEADER_VALUE_BYTES:
            return Rejected(
                record,
                Reason.INVALID_HEADER,
                f"header {name!r} is over {MAX_HEADER_VALUE_BYTES} bytes",
            )
        try:
            out[name] = raw.decode()
        except UnicodeDecodeError:
            return Rejected(record, Reason.INVALID_HEADER, f"header {name!r} is not valid UTF-8")
    return out


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
