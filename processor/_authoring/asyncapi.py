"""The wire contract as an AsyncAPI 3 document: topics, keys, headers and payload schemas.

Built from the message registry and the saga definitions alone, so it is what the processor
really reads and writes. A service in any language finds in it everything it needs: for each
topic the messages on it, the record key to use, the headers to send or expect (with the
``message-type`` and ``schema-version`` values spelt out per message) and the JSON Schema of
each payload (a document-local ``$ref`` to ``components/schemas``).

Direction is the processor's: ``receive`` for topics that sagas consume (events), ``send`` for
topics of commands.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from processor._authoring.definition import SagaDefinition
from processor._authoring.messages import MessageRegistry, MessageType
from processor._wire import (
    HEADER_CAUSATION_ID,
    HEADER_CORRELATION_ID,
    HEADER_DEAD_LETTER_DETAIL,
    HEADER_DEAD_LETTER_REASON,
    HEADER_DEADLINE_UNIX_MS,
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_OCCURRED_AT,
    HEADER_SAGA_ID,
    HEADER_SAGA_TYPE,
    HEADER_SCHEMA_VERSION,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC,
    HEADER_TRACEPARENT,
)

__all__ = ["HEADERS", "asyncapi_document", "render"]

_STRING = {"type": "string"}

HEADERS: dict[str, dict[str, Any]] = {
    HEADER_MESSAGE_ID: {
        "type": "string",
        "minLength": 1,
        "maxLength": 512,
        "description": "Unique per message; a redelivery keeps it. Receivers dedupe by it.",
    },
    HEADER_MESSAGE_TYPE: {"type": "string", "description": "The message's wire name."},
    HEADER_SCHEMA_VERSION: {
        "type": "string",
        "pattern": "^[1-9][0-9]*$",
        "description": "Version of the payload schema, as decimal text.",
    },
    HEADER_CORRELATION_ID: {
        "type": "string",
        "description": "The conversation: copied from the message that caused this one.",
    },
    HEADER_CAUSATION_ID: {
        "type": "string",
        "description": "The message-id of the message that caused this one.",
    },
    HEADER_OCCURRED_AT: {
        "type": "string",
        "format": "date-time",
        "description": "When the fact happened or the request was made, ISO 8601 with offset.",
    },
    HEADER_SAGA_TYPE: {
        "type": "string",
        "description": "On commands: the sending saga's type. Replies copy it.",
    },
    HEADER_SAGA_ID: {
        "type": "string",
        "description": "On commands: the sending saga's id. Replies copy it.",
    },
    HEADER_DEADLINE_UNIX_MS: {
        "type": "string",
        "pattern": "^[0-9]+$",
        "description": (
            "On commands: milliseconds since the Unix epoch after which the receiver must not "
            "start the work; answer with the declared expired reply instead, or drop it."
        ),
    },
    HEADER_TRACEPARENT: {
        "type": "string",
        "description": "W3C trace context; a receiver copies it to its replies.",
    },
}

_EVENT_REQUIRED = (HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE)
_COMMAND_REQUIRED = (
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_SCHEMA_VERSION,
    HEADER_CORRELATION_ID,
    HEADER_CAUSATION_ID,
    HEADER_OCCURRED_AT,
    HEADER_SAGA_TYPE,
    HEADER_SAGA_ID,
)

_DESCRIPTION = """\
Every record is JSON (UTF-8) with string headers. The `message-type` and `schema-version` \
headers select the payload schema; `message-id` is unique per message and kept by redeliveries.

Events that sagas consume: key the record with the value of the field named in the message's \
`x-key` (the saga's association value), so one saga's events stay on one partition and in order. \
Send at least `message-id` and `message-type`; `schema-version` defaults to the latest \
registered version; send `correlation-id`, `causation-id`, `occurred-at` and `traceparent` when \
known.

Commands that sagas send are keyed by the saga id and carry `saga-type`, `saga-id`, \
`correlation-id`, `causation-id`, `occurred-at` and, when the step has a budget, \
`deadline-unix-ms`. A participant answers with events keyed like the command, copying \
`saga-type`, `saga-id`, `correlation-id` and `traceparent`, with the command's `message-id` as \
`causation-id`; it dedupes by `message-id` and answers a redelivered command with the very same \
reply (same `message-id`).

Records that cannot be handled go to the dead-letter topic with the original key, value and \
headers plus `dead-letter-reason`, `dead-letter-detail`, `source-topic`, `source-partition` and \
`source-offset`."""


def _ref(section: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{section}/{_component(name)}"}


def _component(name: str) -> str:
    # Component keys allow letters, digits, '.', '-' and '_' only.
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def _hoist(schema: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    """Moves pydantic's ``$defs`` to components and points the ``$ref``s there."""
    defs = schema.pop("$defs", {})
    for name, sub in defs.items():
        fixed = _rewrite(sub)
        if schemas.setdefault(_component(name), fixed) != fixed:
            raise ValueError(f"two different schemas are named {name!r}; rename one class")
    result: dict[str, Any] = _rewrite(schema)
    return result


def _rewrite(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _rewrite(v) for k, v in node.items()}
        ref = out.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            out["$ref"] = "#/components/schemas/" + _component(ref[len("#/$defs/") :])
        return out
    if isinstance(node, list):
        return [_rewrite(v) for v in node]
    return node


def _headers(entry: MessageType, command: bool) -> dict[str, Any]:
    props = dict(HEADERS)
    props[HEADER_MESSAGE_TYPE] = {**HEADERS[HEADER_MESSAGE_TYPE], "const": entry.name}
    props[HEADER_SCHEMA_VERSION] = {**HEADERS[HEADER_SCHEMA_VERSION], "const": str(entry.version)}
    return {
        "type": "object",
        "required": list(_COMMAND_REQUIRED if command else _EVENT_REQUIRED),
        "properties": props,
    }


def asyncapi_document(
    registry: MessageRegistry,
    sagas: Sequence[SagaDefinition] = (),
    *,
    title: str = "Saga processor messages",
    version: str = "1.0.0",
    topic_prefix: str = "",
    dead_letter_topic: str = "saga-dead-letters",
) -> dict[str, Any]:
    """The AsyncAPI 3.0.0 document of every registered message and its topic.

    Args:
        registry: The registered messages; those without a topic appear under components only.
        sagas: The sagas whose events decide direction and record keys.
        title: The document's title.
        version: The document's version.
        topic_prefix: Prefix of every topic address.
        dead_letter_topic: The dead-letter topic (without prefix).

    Returns:
        The document as plain JSON data.
    """
    consumed: dict[type, set[str]] = {}
    for d in sagas:
        for cls, h in d.event_handlers.items():
            if h.association_property:
                consumed.setdefault(cls, set()).add(h.association_property)
    schemas: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    by_topic: dict[str, list[MessageType]] = {}
    for entry in registry.all():
        key = _component(f"{entry.name}.v{entry.version}")
        payload = _hoist(entry.cls.model_json_schema(mode="validation"), schemas)
        schemas[key] = payload
        is_event = entry.cls in consumed
        fields = sorted(consumed.get(entry.cls, ()))
        key_rule = (
            f"the value of the payload field {' / '.join(fields)} (the saga's association value)"
            if is_event
            else "the saga id (sent by a saga), or the key of the command answered"
        )
        messages[key] = {
            "name": entry.name,
            "title": entry.cls.__name__,
            "summary": (entry.cls.__doc__ or "").strip().split("\n")[0] or entry.name,
            "contentType": "application/json",
            "headers": _headers(entry, command=not is_event),
            "payload": _ref("schemas", key),
            "correlationId": {"location": f"$message.header#/{HEADER_CORRELATION_ID}"},
            "bindings": {
                "kafka": {
                    "key": {"type": "string", "description": f"Record key: {key_rule}."},
                    "bindingVersion": "0.5.0",
                }
            },
            "x-message-type": entry.name,
            "x-schema-version": entry.version,
            "x-key": fields[0] if fields else HEADER_SAGA_ID,
        }
        if entry.topic is not None:
            by_topic.setdefault(entry.topic, []).append(entry)
    for topic, entries in sorted(by_topic.items()):
        channel = _component(topic)
        refs = {_component(f"{e.name}.v{e.version}") for e in entries}
        channels[channel] = {
            "address": topic_prefix + topic,
            "messages": {r: _ref("messages", r) for r in sorted(refs)},
        }
        receive = any(e.cls in consumed for e in entries)
        operations[f"{'receive' if receive else 'send'}-{channel}"] = {
            "action": "receive" if receive else "send",
            "channel": {"$ref": f"#/channels/{channel}"},
            "messages": [{"$ref": f"#/channels/{channel}/messages/{r}"} for r in sorted(refs)],
        }
    channels["dead-letters"] = _dead_letter_channel(topic_prefix + dead_letter_topic)
    messages["DeadLetter"] = _dead_letter_message()
    operations["send-dead-letters"] = {
        "action": "send",
        "channel": {"$ref": "#/channels/dead-letters"},
        "messages": [{"$ref": "#/channels/dead-letters/messages/DeadLetter"}],
    }
    return {
        "asyncapi": "3.0.0",
        "info": {"title": title, "version": version, "description": _DESCRIPTION},
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": dict(sorted(schemas.items()))},
    }


def _dead_letter_channel(address: str) -> dict[str, Any]:
    return {
        "address": address,
        "description": "Records that can never be handled, as received, with why and where from.",
        "messages": {"DeadLetter": _ref("messages", "DeadLetter")},
    }


def _dead_letter_message() -> dict[str, Any]:
    reasons = {
        HEADER_DEAD_LETTER_REASON: {"type": "string", "description": "e.g. unparseable"},
        HEADER_DEAD_LETTER_DETAIL: _STRING,
        HEADER_SOURCE_TOPIC: _STRING,
        HEADER_SOURCE_PARTITION: {"type": "string", "pattern": "^[0-9]+$"},
        HEADER_SOURCE_OFFSET: {"type": "string", "pattern": "^[0-9]+$"},
    }
    return {
        "name": "DeadLetter",
        "summary": "The original record, with the original headers and these.",
        "headers": {"type": "object", "required": list(reasons), "properties": reasons},
        "payload": {"description": "The original value, unchanged (any bytes)."},
    }


def render(document: Mapping[str, Any]) -> str:
    """The document as stable JSON text (sorted keys, trailing newline)."""
    return json.dumps(document, indent=2, sort_keys=True) + "\n"
