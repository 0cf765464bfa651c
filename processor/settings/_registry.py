"""The Schema Registry and each topic's wire format (`SAGA_SCHEMA_REGISTRY__*`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, SecretStr, model_validator

from processor._schemas.formats import SubjectNaming, TopicFormat, WireFormat

__all__ = ["RegistryTopicSettings", "SchemaRegistrySettings"]


class RegistryTopicSettings(BaseModel):
    """One topic's wire format; a bare format name (``"avro"``) is read as this."""

    format: WireFormat = WireFormat.JSON
    # The value's field that is the message id, for records with no `message-id` header of
    # ours; unset: the record's coordinates (topic, partition, offset), stable on redelivery.
    id_field: str | None = None

    def topic_format(self) -> TopicFormat:
        return TopicFormat(self.format, self.id_field)


def _bare_format(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: {"format": v} if isinstance(v, str) else v for k, v in value.items()}
    return value


def _all_secret(value: Any) -> Any:
    # Client settings of a registry are mostly credentials (basic.auth.user.info, bearer
    # tokens, TLS keys): every value is kept secret, never shown in a repr, a log or an error.
    if not isinstance(value, dict):
        return value
    return {k: v if isinstance(v, SecretStr) else SecretStr(str(v)) for k, v in value.items()}


class SchemaRegistrySettings(BaseModel):
    """Where the registry is, and which topics are written in its wire format.

    Topics are named without `SAGA_TOPIC_PREFIX`; a topic not listed is the processor's own
    JSON. Input topics, command topics and reply topics are listed alike.
    """

    # The registry's Confluent-compatible API, e.g. http://registry:8080/apis/ccompat/v7 for
    # Apicurio, http://schema-registry:8081 for Confluent's. Needed once a topic is framed.
    url: str | None = None
    # Further settings of confluent-kafka's SchemaRegistryClient (basic.auth.user.info, ...).
    config: Annotated[dict[str, SecretStr], BeforeValidator(_all_secret)] = Field(
        default_factory=dict
    )
    topics: Annotated[dict[str, RegistryTopicSettings], BeforeValidator(_bare_format)] = Field(
        default_factory=dict
    )
    # Several message types often share a command topic: each gets a subject of its own
    # (<topic>-<record>), so a compatibility check compares a type only with its own history.
    subject_naming: SubjectNaming = SubjectNaming.TOPIC_RECORD
    # Register a command's schema the first time one is sent (what Confluent's serializers do);
    # off: only look it up, so a schema not registered before the deploy stops the relay.
    auto_register: bool = True

    @model_validator(mode="after")
    def _url_when_framed(self) -> SchemaRegistrySettings:
        framed = sorted(t for t, s in self.topics.items() if s.format is not WireFormat.JSON)
        if framed and not self.url:
            raise ValueError(
                f"topics {', '.join(framed)} are set to a registry format: "
                "set SAGA_SCHEMA_REGISTRY__URL"
            )
        return self

    def client_config(self) -> dict[str, str]:
        """confluent-kafka's SchemaRegistryClient settings; a fresh dict each call."""
        assert self.url is not None
        conf = {k: v.get_secret_value() for k, v in self.config.items()}
        return {"url": self.url, **conf}

    def formats(self, prefix: str) -> dict[str, TopicFormat]:
        """Each framed topic's format, by full topic name (``prefix`` in front)."""
        return {
            f"{prefix}{topic}": s.topic_format()
            for topic, s in self.topics.items()
            if s.format is not WireFormat.JSON
        }
