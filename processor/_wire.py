"""The wire format in one place.

Header names, the records the processor itself writes, NOTIFY channels and topic names.

Everything another service (in any language) sees of the processor is spelled here: the headers
of events and commands, the deadline-fired records the poller sends to a saga's own partition,
the headers of dead letters, and how a topic prefix applies. Pure: no client imports.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

__all__ = [
    "DEADLINE_FIRED",
    "HEADER_CAUSATION_ID",
    "HEADER_CORRELATION_ID",
    "HEADER_DEADLINE_ID",
    "HEADER_DEADLINE_NAME",
    "HEADER_DEADLINE_UNIX_MS",
    "HEADER_DEAD_LETTER_DETAIL",
    "HEADER_DEAD_LETTER_REASON",
    "HEADER_DEAD_LETTER_TRUNCATED",
    "HEADER_FENCING_TOKEN",
    "HEADER_MESSAGE_ID",
    "HEADER_MESSAGE_TYPE",
    "HEADER_OCCURRED_AT",
    "HEADER_OPERATOR_AUTH",
    "HEADER_SAGA_ID",
    "HEADER_SAGA_TYPE",
    "HEADER_SCHEMA_VERSION",
    "HEADER_SOURCE_OFFSET",
    "HEADER_SOURCE_PARTITION",
    "HEADER_SOURCE_TOPIC",
    "HEADER_TRACEPARENT",
    "HEADER_TRACESTATE",
    "OPERATOR_CLOCK_SKEW",
    "OPERATOR_COMMAND",
    "OPERATOR_EXPIRY",
    "FiredRecord",
    "OperatorAction",
    "OperatorRecord",
    "Topics",
    "child_traceparent",
    "dead_letter_headers",
    "deadline_channel",
    "envelope",
    "outbox_channel",
    "parse_traceparent",
    "present",
]

# -- headers of events and commands ---------------------------------------------------------
HEADER_MESSAGE_ID = "message-id"
HEADER_MESSAGE_TYPE = "message-type"
HEADER_SCHEMA_VERSION = "schema-version"
HEADER_CORRELATION_ID = "correlation-id"
HEADER_CAUSATION_ID = "causation-id"
HEADER_OCCURRED_AT = "occurred-at"
HEADER_SAGA_TYPE = "saga-type"
HEADER_SAGA_ID = "saga-id"
HEADER_DEADLINE_UNIX_MS = "deadline-unix-ms"
# W3C trace context (https://www.w3.org/TR/trace-context/): carried from an event to the
# commands and fired deadlines it causes.
HEADER_TRACEPARENT = "traceparent"
HEADER_TRACESTATE = "tracestate"

# -- deadline-fired records -----------------------------------------------------------------
DEADLINE_FIRED = "saga.deadline-fired"
HEADER_DEADLINE_ID = "deadline-id"
HEADER_DEADLINE_NAME = "deadline-name"
HEADER_FENCING_TOKEN = "fencing-token"

# -- operator records -----------------------------------------------------------------------
OPERATOR_COMMAND = "saga.operator-command"
HEADER_OPERATOR_AUTH = "operator-auth"
# How long after its issued-at the processor still applies an operator record (the default of
# SAGA_OPERATOR__EXPIRY): a signed record copied off the topic is worth nothing after it.
OPERATOR_EXPIRY = timedelta(minutes=15)
# How far ahead of the processor's clock (the database's) an issued-at may be: the sender's
# clock is another machine's, and a few seconds of drift must not refuse a fresh request. Small,
# so that a record cannot be signed now to be valid for long in the future.
OPERATOR_CLOCK_SKEW = timedelta(minutes=1)

# -- dead letters ---------------------------------------------------------------------------
HEADER_DEAD_LETTER_REASON = "dead-letter-reason"
HEADER_DEAD_LETTER_DETAIL = "dead-letter-detail"
HEADER_SOURCE_TOPIC = "source-topic"
HEADER_SOURCE_PARTITION = "source-partition"
HEADER_SOURCE_OFFSET = "source-offset"
# On a dead letter whose value the relay cut to fit the broker: the original value's size in
# bytes. The whole record stays in the ``dead_letter`` table, found by its ``source-*`` headers.
HEADER_DEAD_LETTER_TRUNCATED = "dead-letter-truncated"


def envelope(
    *,
    message_id: str,
    message_type: str,
    schema_version: int | str | None = None,
    correlation_id: str | None = None,
    causation_id: str | None = None,
    occurred_at: datetime | str | None = None,
    saga_type: str | None = None,
    saga_id: str | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
    deadline_unix_ms: int | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The standard headers of a message the processor, a publisher or a participant sends.

    Every producer builds its headers here, so names, values and order agree on the wire. A
    header whose argument is None is left out. The order: the trace context, then ``extra``
    (headers of the caller's own), then the standard headers, which win a clash with
    ``extra``, then ``deadline-unix-ms``; a record's own headers (a fired deadline's, an
    operator's signature) follow.

    Args:
        message_id: Unique per message; kept by redeliveries.
        message_type: The message's wire name.
        schema_version: The version of the message's schema.
        correlation_id: The conversation the message belongs to.
        causation_id: The message id of the message that caused this one.
        occurred_at: When it happened; text is sent as is (one batch formats its clock once).
        saga_type: The saga that sent it or that it answers.
        saga_id: The saga's id.
        traceparent: W3C trace context to send, already the child span where one is wanted.
        tracestate: W3C trace state to send with it.
        deadline_unix_ms: When a command stops being worth handling, in Unix milliseconds.
        extra: Further headers, e.g. a handler's or a publisher's caller's.
    """
    out: dict[str, str] = {}
    if traceparent is not None:
        out[HEADER_TRACEPARENT] = traceparent
    if tracestate is not None:
        out[HEADER_TRACESTATE] = tracestate
    if extra:
        out.update(extra)
    out[HEADER_MESSAGE_ID] = message_id
    out[HEADER_MESSAGE_TYPE] = message_type
    if schema_version is not None:
        out[HEADER_SCHEMA_VERSION] = str(schema_version)
    if correlation_id is not None:
        out[HEADER_CORRELATION_ID] = correlation_id
    if causation_id is not None:
        out[HEADER_CAUSATION_ID] = causation_id
    if occurred_at is not None:
        out[HEADER_OCCURRED_AT] = (
            occurred_at if isinstance(occurred_at, str) else occurred_at.isoformat()
        )
    if saga_type is not None:
        out[HEADER_SAGA_TYPE] = saga_type
    if saga_id is not None:
        out[HEADER_SAGA_ID] = saga_id
    if deadline_unix_ms is not None:
        out[HEADER_DEADLINE_UNIX_MS] = str(deadline_unix_ms)
    return out


@dataclass(frozen=True, slots=True)
class FiredRecord:
    """A deadline that came due, as the poller sends it to the saga's own input partition.

    The consumer applies it only if ``token`` is the deadline row's dispatch token and the
    current lease token, so a paused ex-leader's late records are no-ops.
    """

    saga_type: str
    saga_id: str
    deadline_id: str
    name: str
    token: int
    due_at: datetime | None = None

    @property
    def message_id(self) -> str:
        """Unique per dispatch: a redispatch under a new token is a new record."""
        return f"deadline:{self.deadline_id}:{self.token}"

    def key(self) -> bytes:
        return self.saga_id.encode()

    def value(self) -> bytes:
        body = {
            "saga_type": self.saga_type,
            "saga_id": self.saga_id,
            "deadline_id": self.deadline_id,
            "name": self.name,
            "token": self.token,
            "due_at": self.due_at.isoformat() if self.due_at is not None else None,
        }
        return json.dumps(body).encode()

    def headers(
        self, traceparent: str | None = None, tracestate: str | None = None
    ) -> dict[str, str]:
        """The fired record's headers; the trace context of the event that set the deadline."""
        headers = envelope(
            message_id=self.message_id,
            message_type=DEADLINE_FIRED,
            saga_type=self.saga_type,
            saga_id=self.saga_id,
            traceparent=child_traceparent(traceparent, self.message_id) if traceparent else None,
            tracestate=tracestate if traceparent and tracestate else None,
        )
        headers[HEADER_DEADLINE_ID] = self.deadline_id
        headers[HEADER_DEADLINE_NAME] = self.name
        headers[HEADER_FENCING_TOKEN] = str(self.token)
        return headers

    @classmethod
    def parse(cls, value: bytes | None) -> FiredRecord:
        """Reads a fired record's value; raises ValueError when it is malformed."""
        try:
            body = json.loads(value or b"")
            return cls(
                saga_type=str(body["saga_type"]),
                saga_id=str(body["saga_id"]),
                deadline_id=str(body["deadline_id"]),
                name=str(body["name"]),
                token=int(body["token"]),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError("malformed deadline-fired record") from e


class OperatorAction(StrEnum):
    """What an operator record asks of one saga instance."""

    CANCEL = "cancel"
    # Ends the saga without running any of its code (no compensation); refused unless forced.
    TERMINATE = "terminate"
    # A person's decision for a step escalated to them; ``name`` holds the decision.
    RESOLVE = "resolve"
    DEADLINE_FIRE_NOW = "deadline-fire-now"
    DEADLINE_CANCEL = "deadline-cancel"
    # Replay a parked saga's held records in order (skip: drop the first one, the one that
    # keeps failing, then replay the rest).
    PARKED_RETRY = "parked-retry"
    PARKED_SKIP = "parked-skip"
    # Delivers an event to the saga as if it had arrived; ``name`` holds its wire name and
    # ``message`` its JSON value.
    INJECT = "inject"
    # Rebuilds the saga before the input whose message id ``name`` holds and replays from it
    # (``saga reset``); ``message`` holds its options as JSON (``{"resend": true}``).
    RESET = "reset"


@dataclass(frozen=True, slots=True)
class OperatorRecord:
    """An operator's request, sent into the saga's own input partition like its events.

    Riding the saga's partition orders the request with the saga's events and fired deadlines,
    and the consumer applies it with the same fencing and duplicate detection. The
    ``operator-auth`` header is an HMAC-SHA256 of the value under the processor's operator key,
    so only holders of that key can produce one; others are dead-lettered.

    Attributes:
        action: What to do.
        saga_type: The saga's type.
        saga_id: The saga's id.
        command_id: Unique per request; a resend of the same request is a duplicate.
        by: Who asked.
        reason: Why; recorded in the saga's history.
        name: The deadline's name, for deadline actions; the decision, for resolve; the
            injected message's wire name, for inject.
        message: The injected message's value as JSON text, for inject (signed with the rest).
        issued_at: When it was signed, in Unix milliseconds. It is part of the signed value, so
            a copy of the record cannot be made younger: the processor refuses one older than
            its expiry (``SAGA_OPERATOR__EXPIRY``). None only in a record an older release
            sent, which the processor refuses as expired.
        batch: The batch the request is one of (``saga cancel --where ...``), recorded with its
            audit entry; None for a request on its own.
    """

    action: OperatorAction
    saga_type: str
    saga_id: str
    command_id: str
    by: str
    reason: str
    name: str | None = None
    issued_at: int | None = None
    message: str | None = None
    batch: str | None = None

    @property
    def message_id(self) -> str:
        return f"operator:{self.command_id}"

    def value(self) -> bytes:
        body: dict[str, object] = {
            "action": str(self.action),
            "saga_type": self.saga_type,
            "saga_id": self.saga_id,
            "command_id": self.command_id,
            "by": self.by,
            "reason": self.reason,
            "name": self.name,
        }
        # Left out rather than null when absent: the value an older release signed. A message
        # is the operator's own JSON text, never re-encoded (no float rounds on the way).
        body.update(present(issued_at=self.issued_at, message=self.message, batch=self.batch))
        return json.dumps(body, sort_keys=True).encode()

    def headers(self, key: bytes) -> dict[str, str]:
        """The record's headers, signed with ``key``."""
        headers = envelope(
            message_id=self.message_id,
            message_type=OPERATOR_COMMAND,
            saga_type=self.saga_type,
            saga_id=self.saga_id,
        )
        headers[HEADER_OPERATOR_AUTH] = operator_signature(key, self.value())
        return headers

    @classmethod
    def parse(cls, value: bytes | None) -> OperatorRecord:
        """Reads an operator record's value; raises ValueError when it is malformed."""
        try:
            body = json.loads(value or b"")
            name = body.get("name")
            issued_at = body.get("issued_at")
            message = body.get("message")
            batch = body.get("batch")
            return cls(
                action=OperatorAction(body["action"]),
                saga_type=str(body["saga_type"]),
                saga_id=str(body["saga_id"]),
                command_id=str(body["command_id"]),
                by=str(body["by"]),
                reason=str(body["reason"]),
                name=str(name) if name is not None else None,
                issued_at=_unix_ms(issued_at) if issued_at is not None else None,
                message=str(message) if message is not None else None,
                batch=str(batch) if batch is not None else None,
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError("malformed operator record") from e


def present(**values: object) -> dict[str, object]:
    """The values given that are not None: a key left out rather than null where one is absent."""
    return {k: v for k, v in values.items() if v is not None}


def _unix_ms(value: object) -> int:
    """An issued-at as sent: an integer, never a bool, float or text that merely reads as one."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError("malformed operator record: issued_at is not an integer")
    return value


def operator_signature(key: bytes, value: bytes) -> str:
    """The ``operator-auth`` header for ``value``: hex HMAC-SHA256 under ``key``."""
    return hmac.new(key, value, hashlib.sha256).hexdigest()


def operator_signed(key: bytes, value: bytes, signature: str | None) -> bool:
    """Whether ``signature`` is the operator signature of ``value`` under ``key``."""
    return signature is not None and hmac.compare_digest(operator_signature(key, value), signature)


def dead_letter_headers(
    original: Mapping[str, str],
    *,
    reason: str,
    detail: str,
    topic: str,
    partition: int,
    offset: int,
) -> dict[str, str]:
    """The original headers plus why and where from: enough to find and replay the record."""
    return {
        **original,
        HEADER_DEAD_LETTER_REASON: reason,
        HEADER_DEAD_LETTER_DETAIL: detail,
        HEADER_SOURCE_TOPIC: topic,
        HEADER_SOURCE_PARTITION: str(partition),
        HEADER_SOURCE_OFFSET: str(offset),
    }


# -- trace context --------------------------------------------------------------------------
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def parse_traceparent(value: str | None) -> tuple[str, str, str] | None:
    """(trace id, parent span id, flags) of a valid ``traceparent``; None otherwise.

    Versions other than 00 are read as 00 (as the specification asks), the all-zero ids and
    version ff are invalid.
    """
    if not value:
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if m is None or m.group(1) == "ff":
        return None
    trace_id, span_id, flags = m.group(2), m.group(3), m.group(4)
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return trace_id, span_id, flags


def child_traceparent(parent: str | None, seed: str) -> str | None:
    """A ``traceparent`` that continues ``parent``'s trace under a new span id.

    The span id is derived from ``seed`` (the child message's id), so a batch planned again
    after a failed commit gives its commands the very same headers. None when ``parent`` is
    missing or invalid: a broken context is dropped rather than forwarded.
    """
    parsed = parse_traceparent(parent)
    if parsed is None:
        return None
    trace_id, parent_span, flags = parsed
    span = hashlib.blake2b(f"{parent_span}:{seed}".encode(), digest_size=8).hexdigest()
    if span == "0" * 16:  # pragma: no cover - one chance in 2**64
        span = "0" * 15 + "1"
    return f"00-{trace_id}-{span}-{flags}"


# -- NOTIFY channels ------------------------------------------------------------------------
def outbox_channel(schema: str) -> str:
    """Notified once per batch that wrote outbox rows; wakes every replica's relay."""
    return f"saga_outbox_{schema}"


def deadline_channel(schema: str) -> str:
    """Notified once per batch that scheduled deadlines; wakes the deadline poller."""
    return f"saga_deadline_{schema}"


# -- topics ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Topics:
    """Topic naming: every topic the processor reads or writes carries ``prefix``."""

    prefix: str = ""

    def name(self, topic: str) -> str:
        """The topic's name on the broker."""
        return self.prefix + topic
