"""Who is asking the console, and what they may do: identities, roles and server-side sessions.

An identity comes from one of three places, first match wins:

1. an authenticating proxy in front of the console: its user header (``X-Forwarded-User`` by
   default), believed only when the connection itself comes from
   ``SAGA_CONSOLE__TRUSTED_PROXIES``. The console judges the socket's peer: the server that runs
   it must not rewrite the client address from ``X-Forwarded-For`` (``processor._console.serve``
   turns uvicorn's rewriting off, and a peer that also stands in the request's own
   ``X-Forwarded-For`` is taken as rewritten, so not trusted);
2. the session cookie set by ``/login``, where an operator signs in with their own key
   (``SAGA_CONSOLE__OPERATORS``), or with the shared ``SAGA_CONSOLE__TOKEN``. The cookie is an
   opaque random id of a session this process keeps: signing out or removing the key ends it;
3. nobody: the ``SAGA_CONSOLE__ANONYMOUS`` role (``viewer`` by default; unset it to require a
   sign-in even for reading).

Roles nest: a ``viewer`` reads (payloads only when ``SAGA_CONSOLE__SHOW_PAYLOADS`` allows), an
``operator`` also retries, skips, fires deadlines, cancels, resolves and replays, an ``admin``
also terminates, purges, discards and acts on every saga a filter matches (a batch). Pure:
the app hands in headers, the peer and the cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from processor._errors import ConfigurationError

__all__ = [
    "ACTION_ROLES",
    "COOKIE",
    "MIN_KEY_LENGTH",
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
    # One action on every saga a filter matches (the sagas list's batch form).
    "batch": "admin",
}

COOKIE = "saga_console"
# A signed-in session lasts a working day; signing in again starts a new one.
SESSION_SECONDS = 12 * 3600
# Keys are typed by people but guessed by machines: 16 characters of a password manager's
# alphabet are past any online guessing, and the sign-in throttle makes that slower still.
MIN_KEY_LENGTH = 16
# Sessions kept at most; past it the oldest go first (a flood of sign-ins cannot grow memory).
MAX_SESSIONS = 10_000

Headers = Sequence[tuple[str, str]]
"""A request's headers as (lower-case name, value) pairs, repeats kept."""


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


@dataclass(frozen=True, slots=True)
class _Session:
    name: str
    expires: float
    # Which key signed it in: a changed or removed key ends the session.
    key_digest: bytes


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def short_keys(keys: Mapping[str, str]) -> list[str]:
    """The names whose key is shorter than :data:`MIN_KEY_LENGTH` (never the keys)."""
    return sorted(name for name, key in keys.items() if len(key) < MIN_KEY_LENGTH)


class Authenticator:
    """Turns a request's headers, peer address and cookie into an :class:`Identity`.

    Args:
        keys: Operator name -> (key, role), for signing in at ``/login``.
        trusted_proxies: Addresses or networks whose user header is believed.
        user_header: The proxy's header naming the user.
        proxy_roles: Role per proxy user; others get ``proxy_role``.
        proxy_role: The role of a proxy user not listed.
        anonymous: The role of a request nobody signed; None denies it everything.
        clock: Seconds since the epoch; sessions expire by it.

    Raises:
        ConfigurationError: A key is shorter than :data:`MIN_KEY_LENGTH`, or a trusted proxy is
            not an address or network.
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
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._keys = dict(keys or {})
        problems = [
            f"the console key of {name!r} is shorter than {MIN_KEY_LENGTH} characters"
            for name in short_keys({n: k for n, (k, _) in self._keys.items()})
        ]
        self._proxies = []
        for proxy in trusted_proxies:
            try:
                self._proxies.append(ipaddress.ip_network(proxy, strict=False))
            except ValueError:
                problems.append(f"trusted proxy {proxy!r} is not an address or a network")
        if problems:
            raise ConfigurationError(problems, subject="console sign-in")
        self._header = user_header.lower()
        self._proxy_roles = dict(proxy_roles or {})
        self._proxy_role = proxy_role
        self._anonymous = anonymous
        self._clock = clock
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def add_key(self, name: str, key: str, role: Role) -> None:
        """Lets ``name`` sign in with ``key`` as ``role`` (ending sessions of an older key)."""
        if len(key) < MIN_KEY_LENGTH:
            raise ConfigurationError(
                [f"the console key of {name!r} is shorter than {MIN_KEY_LENGTH} characters"],
                subject="console sign-in",
            )
        self._keys[name] = (key, role)

    def remove_key(self, name: str) -> None:
        """Stops ``name`` signing in, and ends every session they hold."""
        self._keys.pop(name, None)
        with self._lock:
            for sid in [s for s, v in self._sessions.items() if v.name == name]:
                del self._sessions[sid]

    @property
    def authenticates(self) -> bool:
        """Whether anyone can sign in at all (a proxy or keys are configured)."""
        return bool(self._keys or self._proxies)

    @property
    def takes_keys(self) -> bool:
        """Whether someone can sign in at ``/login`` with a key (per-operator or shared)."""
        return bool(self._keys)

    @property
    def open_to_anyone(self) -> bool:
        """Whether a request nobody signed may read."""
        return self._anonymous is not None

    def identify(self, headers: Headers, peer: str | None, cookie: str | None) -> Identity:
        """The identity of one request, from its headers, its socket peer and its cookie."""
        if self.from_proxy(headers, peer):
            users = [v.strip() for n, v in headers if n == self._header]
            # A proxy that appended its user to one the client sent would name two: believe
            # neither.
            if len(users) == 1 and users[0]:
                return Identity(users[0], self._proxy_roles.get(users[0], self._proxy_role))
        session = self._session(cookie) if cookie else None
        if session is not None:
            return session
        return Identity(None, self._anonymous)

    def from_proxy(self, headers: Headers, peer: str | None) -> bool:
        """Whether the request came straight from a trusted proxy.

        A peer that stands in the request's own ``X-Forwarded-For`` is a client address a server
        rewrote from that header (uvicorn does by default), not a socket's: never trusted.
        """
        if peer is None or not self._trusted(peer):
            return False
        return peer not in _forwarded_for(headers)

    def client_address(self, headers: Headers, peer: str | None) -> str:
        """Who to throttle and log: the peer, or the client a trusted proxy names last."""
        if self.from_proxy(headers, peer):
            forwarded = _forwarded_for(headers)
            if forwarded:
                return forwarded[-1]
        return peer or "unknown"

    def over_tls(self, scheme: str, headers: Headers, peer: str | None) -> bool:
        """Whether the browser reached the console over TLS (itself, or a proxy that says so)."""
        if scheme == "https":
            return True
        if not self.from_proxy(headers, peer):
            return False
        proto = [v.strip().lower() for n, v in headers if n == "x-forwarded-proto"]
        return proto[-1:] == ["https"]

    def sign_in(self, name: str, key: str) -> Identity | None:
        """The operator ``name`` if ``key`` is theirs; None otherwise (the same time either way)."""
        known = self._keys.get(name)
        expected = known[0] if known is not None else ""
        ok = hmac.compare_digest(key.encode(), expected.encode()) and known is not None
        return Identity(name, known[1]) if ok and known is not None else None

    def start_session(self, identity: Identity) -> str:
        """A new session for a signed-in ``identity``; returns the cookie's value."""
        assert identity.name is not None
        sid = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            for old in [s for s, v in self._sessions.items() if v.expires <= now]:
                del self._sessions[old]
            while len(self._sessions) >= MAX_SESSIONS:
                del self._sessions[next(iter(self._sessions))]
            key = self._keys[identity.name][0]
            self._sessions[sid] = _Session(identity.name, now + SESSION_SECONDS, _digest(key))
        return sid

    def end_session(self, cookie: str | None) -> None:
        """Ends the session ``cookie`` names: its cookie no longer signs anyone in."""
        if cookie:
            with self._lock:
                self._sessions.pop(cookie, None)

    def _session(self, sid: str) -> Identity | None:
        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                return None
            known = self._keys.get(session.name)
            live = session.expires > self._clock()
            if not live or known is None or _digest(known[0]) != session.key_digest:
                del self._sessions[sid]
                return None
        # The role the key has now, not the one it had at sign-in.
        return Identity(session.name, known[1])

    def _trusted(self, peer: str) -> bool:
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in network for network in self._proxies)


def _forwarded_for(headers: Headers) -> list[str]:
    """Every address of every ``X-Forwarded-For`` header, in order."""
    return [
        part.strip()
        for name, value in headers
        if name == "x-forwarded-for"
        for part in value.split(",")
        if part.strip()
    ]
