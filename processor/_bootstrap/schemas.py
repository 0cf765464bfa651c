"""The Schema Registry's resolvers, built from the settings (None when no topic is framed)."""

from __future__ import annotations

from processor._authoring.messages import MessageRegistry
from processor._kafka.registry import RegistryClient
from processor._ports.consumer import RecordProducer
from processor._runtime.schemas import FramingProducer, SchemaResolver
from processor._schemas.codec import Wire
from processor.settings import SchemaRegistrySettings

__all__ = ["framed", "registry_client", "resolver_for"]


def registry_client(settings: SchemaRegistrySettings) -> RegistryClient:
    """The registry the settings name (``SAGA_SCHEMA_REGISTRY__URL`` must be set)."""
    return RegistryClient(settings.client_config())


def resolver_for(
    settings: SchemaRegistrySettings, prefix: str, registry: MessageRegistry
) -> SchemaResolver | None:
    """A resolver over its own codec and client; None when every topic is our JSON.

    Each loop gets its own (the consumer's and the relay's run on different threads).
    """
    formats = settings.formats(prefix)
    if not formats:
        return None
    wire = Wire(formats, registry, settings.subject_naming)
    client = RegistryClient(settings.client_config())
    return SchemaResolver(wire, client, auto_register=settings.auto_register)


def framed(producer: RecordProducer, resolver: SchemaResolver | None) -> RecordProducer:
    """``producer``, framing each record for its topic's format when a topic is framed."""
    return producer if resolver is None else FramingProducer(producer, resolver)
