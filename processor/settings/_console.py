"""Who operates the processor: signing operator requests, and the web console's access."""

from __future__ import annotations

import ipaddress
import re
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from processor._wire import OPERATOR_EXPIRY
from processor.settings._values import Duration

__all__ = [
    "ConsoleOperator",
    "ConsoleRole",
    "ConsoleSettings",
    "OperatorSettings",
]


class OperatorSettings(BaseModel):
    """Operator requests sent into sagas' partitions (``SAGA_OPERATOR__*``)."""

    # Signs operator records (HMAC-SHA256). The processor applies records signed with it as
    # they say who asked: give it to trusted signers only (the console, which records its
    # signed-in user; automation). Unset, with no `keys`: operator records are dead-lettered and
    # the commands that send them refuse to run.
    key: SecretStr | None = None
    # Each person's own key, by name, e.g. {"alice": "..."}: the processor applies a record
    # signed with one and records that name as who asked, whatever the record says. A person
    # sets their key as SAGA_OPERATOR__KEY where they run the CLI.
    keys: dict[str, SecretStr] = Field(default_factory=dict)
    # Who asked, recorded with each request; defaults to the OS user running the command.
    name: str | None = None
    # How long after it was signed the processor still applies an operator record; an older one
    # (or one without an issued-at, from an older release) is refused as expired, so a signed
    # record copied off the topic cannot be replayed later. Judged by the database's clock.
    expiry: Duration = Field(default=OPERATOR_EXPIRY, gt=timedelta(0))


ConsoleRole = Literal["viewer", "operator", "admin"]


# Keys are typed by people but guessed by machines (see processor._console.auth.MIN_KEY_LENGTH,
# which the console checks again for keys given in code).
MIN_CONSOLE_KEY = 16
_HEADER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*$")


def _long_enough(value: SecretStr | None) -> SecretStr | None:
    if value is not None and len(value.get_secret_value()) < MIN_CONSOLE_KEY:
        raise ValueError(f"shorter than {MIN_CONSOLE_KEY} characters")
    return value


class ConsoleOperator(BaseModel):
    """One operator who signs in to the console with their own key."""

    # A misspelt field (`rol`) would otherwise leave the operator with the default role.
    model_config = ConfigDict(extra="forbid")

    key: SecretStr
    role: ConsoleRole = "operator"

    _key_length = field_validator("key")(_long_enough)


class ConsoleSettings(BaseModel):
    """The web console (``SAGA_CONSOLE__*``): see `saga-processor console` and _console/auth.py."""

    host: str = "127.0.0.1"
    port: int = Field(default=8088, ge=0, le=65535)
    # A key shared by everyone: signing in with it makes an admin named SAGA_OPERATOR__NAME.
    # Prefer per-operator keys (`operators`) or an authenticating proxy.
    token: SecretStr | None = None
    # Per-operator keys and roles, e.g. {"alice": {"key": "...", "role": "admin"}}: the name
    # signed in is what every action records as "by".
    operators: dict[str, ConsoleOperator] = Field(default_factory=dict)
    # Addresses or networks of an authenticating proxy; its user header is believed only from
    # these (never from a client that could set it itself).
    trusted_proxies: list[str] = Field(default_factory=list)
    user_header: str = "X-Forwarded-User"
    # Roles of proxy users by name; a proxy user not listed gets `proxy_role`.
    roles: dict[str, ConsoleRole] = Field(default_factory=dict)
    proxy_role: ConsoleRole = "viewer"
    # What a request nobody signed may do: read as a viewer, or nothing at all (null).
    anonymous: ConsoleRole | None = "viewer"
    # Whether viewers see saga state, message payloads and dead-letter values (operators and
    # admins always do).
    show_payloads: bool = False

    _token_length = field_validator("token")(_long_enough)

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for proxy in value:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(f"{proxy!r} is not an address or a network") from None
        return value

    @field_validator("user_header")
    @classmethod
    def _header(cls, value: str) -> str:
        if not _HEADER_NAME.match(value):
            raise ValueError("not an HTTP header name")
        return value
