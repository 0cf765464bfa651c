"""Who is asking the console, and what they may do: identities, roles and a signed session.

An identity comes from one of three places, first match wins:

1. an authenticating proxy in front of the console: its user header (``X-Forwarded-User`` by
   default), believed only on connections from ``SAGA_CONSOLE__TRUSTED_PROXIES``;
2. the session cookie set by ``/login``, where an operator signs in with their own key
   (``SAGA_CONSOLE__OPERATORS``), or with the shared ``SAGA_CONSOLE__TOKEN``;
3. nobody: the ``SAGA_CONSOLE__ANONYMOUS`` role (``viewer`` by default; unset it to require a
   sign-in even for reading).

Roles nest: a ``viewer`` reads (payloads only when ``SAGA_CONSOLE__SHOW_PAYLOADS`` allows), an
``operator`` also retries, skips, fires deadlines, cancels, resolves and replays, an ``admin``
also terminates, purges and discards. Pure: the app hands in headers, the client address and the
cookie.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ACTION_ROLES",
    "COOKIE",
    "Authenticator",
    "Identity",
    "Role",
    "allowed",
]

Role = Literal["viewer", "operator", "admin"]
_RANK: dict[str, int] = {"viewer": 0, "operator": 1, "admin": 2}

# The least role each action needs.
ACTION_ROLES: dict[str, Role] = {
    "retry": "operator",
    "skip": "operator",
    "fire-now": "operator",
    "cancel-deadline": "operator",
    "cancel": "operator",
    "resolve": "operator",
    "replay": "operator",
    "outbox-retry": "operator",
    "terminate": "admin",
    "purge": "admin",
    "discard": "admin",
}

COOKIE = "saga_console"
# A signed-in session lasts a working day; signing in again starts a new one.
SESSION_SECONDS = 12 * 3600


@dataclass(frozen=True, slots=True)
class Identity:
    """Who asks (None: nobody signed in) and with which role (None: no access at all)."""

    name: str | None
    role: Role | None

    def may(self, needed: Role) -> bool:
        """Whether this identity holds ``needed`` or a higher role."""
        return self.role is not None and _RANK[self.role] >= _RANK[needed]


def allowed(identity: Identity, action: str) -> Role | None:
    """None when ``identity`` may run ``action``; else the role it needs."""
    needed = ACTION_ROLES.get(action, "admin")
    return None if identity.may(needed) else needed


class Authenticator:
    """Turns a request's headers, address and cookie into an :class:`Identity`.

    Args:
        keys: Operator name -> (key, role), for signing in at ``/login``.
        trusted_proxies: Addresses or networks whose user header is believed.
        user_header: The proxy's header naming the user.
        proxy_roles: Role per proxy user; others get ``proxy_role``.
        proxy_role: The role of a proxy user not listed.
        anonymous: The role of a request nobody signed; None denies it everything.
        secret: Signs session cookies; a fresh random one by default (a restart signs all out).
    """

    def __init__(
        self,
        *,
        keys: Mapping[str, tuple[str, Role]] | None = None,
        trusted_proxies: Sequence[str] = (),
        user_header: str = "X-Forwarded-User",
        proxy_roles: Mapping[str, Role] | None = None,
        proxy_role: Role = "viewer",
        anonymous: Role | None = "viewer",
        secret: bytes | None = None,
    ) -> None:
        self._keys = dict(keys or {})
        self._proxies = [ipaddress.ip_network(p, strict=False) for p in trusted_proxies]
        self._header = user_header.lower()
        self._proxy_roles = dict(proxy_roles or {})
        self._proxy_role = proxy_role
        self._anonymous = anonymous
        self._secret = secret or os.urandom(32)

    def add_key(self, name: str, key: str, role: Role) -> None:
        """Lets ``name`` sign in with ``key`` as ``role``."""
        self._keys[name] = (key, role)

    @property
    def authenticates(self) -> bool:
        """Whether anyone can sign in at all (a proxy or keys are configured)."""
        return bool(self._keys or self._proxies)

    @property
    def open_to_anyone(self) -> bool:
        """Whether a request nobody signed may read."""
        return self._anonymous is not None

    def identify(
        self, headers: Mapping[str, str], client: str | None, cookie: str | None
    ) -> Identity:
        """The identity of one request."""
        if client is not None and self._trusted(client):
            user = headers.get(self._header, "").strip()
            if user:
                return Identity(user, self._proxy_roles.get(user, self._proxy_role))
        session = self._session(cookie) if cookie else None
        if session is not None:
            return session
        return Identity(None, self._anonymous)

    def sign_in(self, name: str, key: str) -> Identity | None:
        """The operator ``name`` if ``key`` is theirs; None otherwise (the same time either way)."""
        known = self._keys.get(name)
        expected = known[0] if known is not None else ""
        ok = hmac.compare_digest(key.encode(), expected.encode()) and known is not None
        return Identity(name, known[1]) if ok and known is not None else None

    def cookie(self, identity: Identity, now: float | None = None) -> str:
        """A signed session value for ``identity``."""
        expires = int((time.time() if now is None else now) + SESSION_SECONDS)
        body = f"{identity.name}\n{identity.role}\n{expires}".encode()
        sig = hmac.new(self._secret, body, hashlib.sha256).digest()
        return (
            base64.urlsafe_b64encode(body).decode() + "." + base64.urlsafe_b64encode(sig).decode()
        )

    def _session(self, value: str, now: float | None = None) -> Identity | None:
        try:
            body_text, sig_text = value.split(".", 1)
            body = base64.urlsafe_b64decode(body_text)
            sig = base64.urlsafe_b64decode(sig_text)
        except ValueError:
            return None
        if not hmac.compare_digest(sig, hmac.new(self._secret, body, hashlib.sha256).digest()):
            return None
        name, role, expires = body.decode().split("\n")
        if int(expires) < (time.time() if now is None else now) or role not in _RANK:
            return None
        return Identity(name, role)  # type: ignore[arg-type]  # checked against _RANK

    def _trusted(self, client: str) -> bool:
        try:
            address = ipaddress.ip_address(client)
        except ValueError:
            return False
        return any(address in network for network in self._proxies)
