"""The Kafka settings: the broker, librdkafka properties (credentials kept secret), new topics."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, SecretStr

__all__ = [
    "KafkaSettings",
    "TopicsSettings",
    "is_secret_key",
]


def is_secret_key(key: str) -> bool:
    """True for librdkafka properties that hold credentials.

    Those are ``*.password``, ``sasl.*``, ``ssl.key.*`` and the OAuth client secret.
    """
    k = key.strip().lower()
    return (
        k.endswith(".password")
        or k.startswith("sasl.")
        or k.startswith("ssl.key.")
        or k.endswith(".client.secret")
    )


def _hide_secrets(value: Any) -> Any:
    # Wrapped before validation, so the plain text never sits in the model: repr, str,
    # model_dump and validation errors all show "**********".
    if not isinstance(value, dict):
        return value
    return {
        k: SecretStr(str(v)) if is_secret_key(str(k)) and not isinstance(v, SecretStr) else v
        for k, v in value.items()
    }


class KafkaSettings(BaseModel):
    """The broker to talk to and librdkafka settings for every client (`SAGA_KAFKA__*`).

    Credentials among the librdkafka settings (see :func:`is_secret_key`) are kept as
    ``SecretStr``: they never show in a repr, a log line or an error; only
    :meth:`client_config` hands out their values, to the Kafka clients.
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    # Passed to librdkafka untouched (e.g. security.protocol, sasl.mechanism); never logged.
    config: Annotated[dict[str, str | SecretStr], BeforeValidator(_hide_secrets)] = Field(
        default_factory=dict
    )
    sasl_password: SecretStr | None = None

    def client_config(self) -> dict[str, str]:
        """A fresh dict each call: clients must never share or mutate the caller's config."""
        conf = {"bootstrap.servers": self.bootstrap_servers}
        for key, value in self.config.items():
            conf[key] = value.get_secret_value() if isinstance(value, SecretStr) else value
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        return conf


class TopicsSettings(BaseModel):
    """What `saga-processor topics create` gives the topics it makes (and `check` expects)."""

    partitions: int = Field(default=12, ge=1)
    # Three copies: a broker can fail, or be restarted for an upgrade, without losing a record.
    replication_factor: int = Field(default=3, ge=1)
