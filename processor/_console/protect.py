"""The console's defences against a hostile browser or client, kept apart from its pages.

- :class:`Throttle`: failed sign-ins and action keys, per address and per name, with back-off.
- :class:`FormTokens`: a per-browser form token (the cookie ``saga_console_form`` and an HMAC of
  it with the session), so a page on another origin cannot post a form that acts.
- :class:`Shield`: ASGI middleware on every response: a per-request CSP nonce, security
  headers, the form cookie, a same-origin check of every request that changes something, and a
  400 for a path or query value no page takes (a NUL character, or one longer than any id).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlsplit

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from processor._console.auth import COOKIE, Authenticator, Identity
from processor._errors import SagaError

__all__ = [
    "FORM_COOKIE",
    "MAX_PARAMETER",
    "FormTokens",
    "Keys",
    "Shield",
    "Throttle",
    "parameter_problem",
    "row_id",
]

log = logging.getLogger(__name__)

FORM_COOKIE = "saga_console_form"
# Longer than any saga id, type or filter the console serves (ids are capped far below it).
MAX_PARAMETER = 2000
# Scripts only with this request's nonce; inline styles allowed (the diagram sizes itself with
# one, and a style cannot act); nothing framed, posted or loaded from elsewhere.
_CSP = (
    "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; "
    "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


# Row ids are PostgreSQL bigints: a larger number names no row (and would not fit a parameter).
_MAX_ID = 2**63 - 1


def row_id(name: str, value: str | None) -> int | None:
    """The row id ``value`` of the parameter ``name``.

    Raises:
        SagaError: It is not a whole number from 0 to the largest bigint.
    """
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or int(value) > _MAX_ID:
        raise SagaError(f"bad parameter {name}: not a row id (a whole number up to {_MAX_ID})")
    return int(value)


def parameter_problem(name: str, value: str) -> str | None:
    """What is wrong with a request parameter any page would refuse; None if nothing."""
    if "\x00" in value:
        return f"bad parameter {name}: it holds a NUL character"
    if len(value) > MAX_PARAMETER:
        return f"bad parameter {name}: longer than {MAX_PARAMETER} characters"
    return None


@dataclass(slots=True)
class _Failures:
    count: int
    last: float
    blocked_until: float


class Throttle:
    """Counts failed attempts by key (an address, a name); past ``free`` they back off.

    The ``free``-th failure in a row blocks the key for ``base`` seconds, and each further one
    for twice as long as the one before (``cap`` at most); a key quiet for ``forget`` seconds
    starts over. People mistype a key a few times; a script guessing gets ``free`` tries and
    then one every few minutes at best. Blocked attempts are refused without checking the key
    they carry, so guessing runs at the back-off's pace whatever the client sends.

    Args:
        free: Failures allowed before any wait.
        base: The first wait, in seconds.
        cap: The longest wait, in seconds.
        forget: Seconds without a failure after which a key starts over.
        clock: Monotonic seconds.
        most: Keys tracked at most; the oldest are forgotten first.
    """

    def __init__(
        self,
        *,
        free: int = 5,
        base: float = 30.0,
        cap: float = 900.0,
        forget: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        most: int = 100_000,
    ) -> None:
        self._free, self._base, self._cap, self._forget = free, base, cap, forget
        self._clock = clock
        self._most = most
        self._keys: dict[str, _Failures] = {}
        self._lock = threading.Lock()

    def wait(self, keys: Iterable[str]) -> float:
        """Seconds until every one of ``keys`` may try again (0: now)."""
        now = self._clock()
        with self._lock:
            found = [self._keys.get(k) for k in keys]
        return max([0.0, *(f.blocked_until - now for f in found if f is not None)])

    def failed(self, keys: Iterable[str]) -> int:
        """Records a failure of each of ``keys``; returns the most failures in a row among them."""
        now = self._clock()
        worst = 0
        with self._lock:
            for key in keys:
                f = self._keys.pop(key, None)
                if f is None or now - f.last > self._forget:
                    f = _Failures(0, now, now)
                f.count += 1
                f.last = now
                over = f.count - self._free
                if over >= 0:
                    f.blocked_until = now + min(self._cap, self._base * 2**over)
                # Re-inserted last: the dict's order is the order of last failure.
                self._keys[key] = f
                worst = max(worst, f.count)
            while len(self._keys) > self._most:
                del self._keys[next(iter(self._keys))]
        return worst

    def succeeded(self, keys: Iterable[str]) -> None:
        """Forgets the failures of ``keys``."""
        with self._lock:
            for key in keys:
                self._keys.pop(key, None)


class FormTokens:
    """Form tokens bound to a browser's form cookie and its session.

    A page on another origin can make a browser post a form but cannot read the console's
    cookie or pages, so it cannot know the token that goes with them.
    """

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    @staticmethod
    def new_cookie() -> str:
        """A fresh form cookie's value."""
        return secrets.token_urlsafe(24)

    def token(self, form_cookie: str, session: str | None) -> str:
        """The token forms carry for ``form_cookie`` within ``session`` (None: none)."""
        body = f"{form_cookie}\n{session or ''}".encode()
        return hmac.new(self._secret, body, hashlib.sha256).hexdigest()

    def valid(self, form_cookie: str | None, session: str | None, token: str | None) -> bool:
        """Whether ``token`` is the one for ``form_cookie`` and ``session``."""
        if not form_cookie or not token:
            return False
        return hmac.compare_digest(self.token(form_cookie, session), token)


class Shield:
    """ASGI middleware: security headers, the form cookie, origin and parameter checks.

    Args:
        app: The console's application.
        secure: Whether a request reached the console over TLS (cookies are then ``Secure``).
        host: The host (and port) the browser addressed, which its ``Origin`` must name.
    """

    def __init__(
        self, app: ASGIApp, secure: Callable[[Scope], bool], host: Callable[[Scope], str]
    ) -> None:
        self._app = app
        self._secure = secure
        self._host = host

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serves one request (or refuses it before the console sees it)."""
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        nonce = secrets.token_urlsafe(16)
        cookies = _cookies(scope)
        form_cookie = cookies.get(FORM_COOKIE)
        fresh = form_cookie is None or not 16 <= len(form_cookie) <= 64
        if fresh:
            form_cookie = FormTokens.new_cookie()
        state = scope.setdefault("state", {})
        state["csp_nonce"] = nonce
        state["form_cookie"] = form_cookie
        secure = self._secure(scope)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["Content-Security-Policy"] = _CSP.format(nonce=nonce)
                headers["X-Content-Type-Options"] = "nosniff"
                headers["X-Frame-Options"] = "DENY"
                headers["Referrer-Policy"] = "same-origin"
                headers.setdefault("Cache-Control", "no-store")
                if fresh:
                    flags = "; HttpOnly; SameSite=Strict; Path=/" + ("; Secure" if secure else "")
                    headers.append("Set-Cookie", f"{FORM_COOKIE}={form_cookie}{flags}")
            await send(message)

        refusal = _refusal(scope, self._host)
        if refusal is not None:
            status, text = refusal
            await send_with_headers(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8")],
                }
            )
            await send_with_headers({"type": "http.response.body", "body": text.encode()})
            return
        await self._app(scope, receive, send_with_headers)


def _cookies(scope: Scope) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # a malformed cookie header is no cookie
                return {}
    return {k: m.value for k, m in jar.items()}


def _refusal(scope: Scope, host: Callable[[Scope], str]) -> tuple[int, str] | None:
    """The status and line that refuse a request before any page sees it; None to serve it."""
    path: str = scope.get("path", "")
    problem = parameter_problem("path", path)
    if problem is not None:
        return 400, problem
    query = scope.get("query_string", b"").decode("latin-1")
    for name, value in parse_qsl(query, keep_blank_values=True):
        problem = parameter_problem(name[:40], value) or parameter_problem("name", name)
        if problem is not None:
            return 400, problem
    if scope.get("method") in _STATE_CHANGING:
        why = _cross_origin(scope, host(scope))
        if why is not None:
            return 403, f"refused: {why}"
    return None


def _cross_origin(scope: Scope, host: str) -> str | None:
    """Why a state-changing request is not from one of the console's own pages; None if it is.

    The browser says where a request comes from: ``Sec-Fetch-Site`` (recent browsers) and
    ``Origin`` (every browser on a POST). A client that sends neither is no browser acting for
    someone else; the form token still has to match.
    """
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"a cross-site request ({site})"
    origin = headers.get("origin")
    if origin is None:
        return None
    if origin == "null" or urlsplit(origin).netloc.lower() != host.lower():
        return f"a request from another origin ({origin[:100]!r})"
    return None


class Keys:
    """Checks what a form carries: its form token, and keys, slowed down when guessed.

    Args:
        auth: Who may sign in.
        throttle: Failures per address and per name.
        forms: The form tokens pages carry.
        address: The client address of a request (to throttle and log).
    """

    def __init__(
        self,
        auth: Authenticator,
        throttle: Throttle,
        forms: FormTokens,
        address: Callable[[Request], str],
    ) -> None:
        self.auth = auth
        self._throttle = throttle
        self._forms = forms
        self._address = address

    async def form(self, request: Request) -> tuple[dict[str, str], Response | None]:
        """The posted form, or the response refusing it (no token of this page, a NUL)."""
        form = {k: str(v) for k, v in (await request.form()).items()}
        session = request.cookies.get(COOKIE)
        if not self._forms.valid(request.cookies.get(FORM_COOKIE), session, form.get("csrf")):
            text = "refused: the form's token is missing or stale; reload the page and try again"
            return form, Response(text, 403)
        for name, value in form.items():
            problem = parameter_problem(name[:40], value) or parameter_problem("name", name)
            if problem is not None:
                return form, Response(problem, 400)
        return form, None

    def sign_in(
        self, request: Request, name: str, key: str
    ) -> tuple[Identity | None, Response | None]:
        """``name``'s identity if ``key`` is theirs; a 429 while this address or name waits."""
        address = self._address(request)
        keys = (f"address:{address}", f"name:{name}")
        wait = self._throttle.wait(keys)
        if wait > 0:
            log.warning("console: sign-in as %r from %s refused, throttled", name, address)
            text = f"too many wrong keys: try again in {int(wait) + 1} s"
            return None, Response(text, 429, {"Retry-After": str(int(wait) + 1)})
        identity = self.auth.sign_in(name, key)
        if identity is None:
            n = self._throttle.failed(keys)
            log.warning("console: wrong key for %r from %s (%d in a row)", name, address, n)
            return None, None
        self._throttle.succeeded(keys)
        return identity, None
