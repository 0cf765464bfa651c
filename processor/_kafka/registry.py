"""The Schema Registry adapter: confluent-kafka's SchemaRegistryClient behind four calls.

Every call says one of three things: the answer, "the registry holds no such thing" (None), or
``Retryable`` (the registry cannot be reached or failed): a registry outage is waited out like a
database outage, never mistaken for an unknown schema. A refused registration (an incompatible
schema) is :class:`SchemaRefused`.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping
from typing import Any

from processor._errors import Retryable, SchemaRefused
from processor._schemas.codec import RegisteredSchema, WriterSchema, proto_descriptor

__all__ = ["RegistryClient"]

log = logging.getLogger(__name__)

# Short: a request in a batch's way must not hold it for the client's default of minutes.
_CLIENT_DEFAULTS = {"timeout": 5, "max.retries": 1, "retries.wait.ms": 200}


class RegistryClient:
    """:class:`processor._ports.registry.SchemaRegistry` over confluent-kafka's client.

    Its client is made on first use.

    Args:
        config: SchemaRegistryClient settings, ``url`` among them.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = {**_CLIENT_DEFAULTS, **config}
        self._client: Any = None

    @property
    def url(self) -> str:
        return str(self._config["url"])

    def _sr(self) -> Any:
        if self._client is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            self._client = SchemaRegistryClient(dict(self._config))
        return self._client

    def fetch(self, schema_id: int) -> RegisteredSchema | None:
        """The schema of ``schema_id``; None when the registry holds none."""
        what = f"schema id {schema_id}"
        schema = self._call(lambda sr: sr.get_schema(schema_id), what)
        if schema is None:
            return None
        found = RegisteredSchema(str(schema.schema_type or "AVRO"), str(schema.schema_str))
        if found.kind == "PROTOBUF" and proto_descriptor(found) is None:
            # .proto text (a Java producer's): the registry makes the descriptor from it.
            serialized = self._call(lambda sr: sr.get_schema(schema_id, fmt="serialized"), what)
            if serialized is not None:
                return RegisteredSchema(found.kind, found.text, _bytes(str(serialized.schema_str)))
        return found

    def register(self, writer: WriterSchema) -> int:
        """The id of ``writer`` under its subject, registered if it is new there."""
        found = self._call(
            lambda sr: sr.register_schema(writer.subject, _schema(writer)),
            f"subject {writer.subject}",
            refusal=True,
        )
        if found is None:
            raise SchemaRefused(f"the registry refused the schema of subject {writer.subject}")
        return int(found)

    def lookup(self, writer: WriterSchema) -> int | None:
        """The id of ``writer`` under its subject; None when it is not registered there."""
        found = self._call(
            lambda sr: sr.lookup_schema(writer.subject, _schema(writer)),
            f"subject {writer.subject}",
        )
        return None if found is None else int(found.schema_id)

    def compatible(self, writer: WriterSchema) -> bool:
        """Whether the subject's rules accept ``writer`` (a subject with no versions does)."""
        found = self._call(
            lambda sr: sr.test_compatibility(writer.subject, _schema(writer)),
            f"subject {writer.subject}",
        )
        # Confluent's registry answers 404 for a new subject, Apicurio true.
        return True if found is None else bool(found)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _call(self, call: Any, what: str, *, refusal: bool = False) -> Any:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return call(self._sr())
        except SchemaRegistryError as e:
            status = e.http_status_code
            if status == 404:
                return None
            if refusal and status in (409, 422):
                raise SchemaRefused(
                    f"the registry refused the schema of {what}: {e.error_message}"
                ) from None
            if status is not None and 400 <= status < 500:
                raise SchemaRefused(f"the registry refused {what}: {e.error_message}") from None
            raise Retryable(f"schema registry failed ({what}): HTTP {status}") from None
        except Exception as e:  # the transport's: refused connection, timeout, DNS
            raise Retryable(f"schema registry unreachable ({what}): {type(e).__name__}") from None


def _bytes(text: str) -> bytes:
    """A serialized descriptor as the registry sent it: base64, else one byte per character."""
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        return text.encode("latin-1", "replace")


def _schema(writer: WriterSchema) -> Any:
    from confluent_kafka.schema_registry import Schema

    return Schema(writer.text, writer.format.registry_type)
