"""Every console route and every parameter it reads, given hostile values over real HTTP.

NUL characters, line breaks, numbers past any column, markup, and megabyte strings, in each path
parameter, query parameter and form field, as someone not signed in and as a signed-in admin:
nothing answers 5xx, and no HTML page repeats the markup unescaped. The route table is checked
against the application's own, so a new route or parameter must be added here to pass.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from urllib.parse import quote, urlencode

import httpx
import pytest
from starlette.routing import Route

from processor._console import Backend, create_app
from processor._console.auth import Authenticator
from tests.integration.test_console import _serve, world  # noqa: F401 - the fixture
from tests.support.console import FormClient
from tests.support.orders import Orders

pytestmark = [pytest.mark.integration]

MARKUP = "<script>alert('x')</script>"
ATTRIBUTE = '"><img src=x onerror=alert(1)>'
HOSTILE = [
    "\x00",
    "a\x00b",
    "\r\nSet-Cookie: x=1",
    "9" * 40,
    "-1",
    "1e999",
    MARKUP,
    ATTRIBUTE,
    "%00%",
    "\u202eevil",
    "../../etc/passwd",
    "x" * 1_000_000,
]
ADMIN = ("ada", "ada-key-0123456789")

# Path -> the query parameters its page reads (GET), or the form fields its action reads (POST).
GETS: dict[str, list[str]] = {
    "/": ["refresh"],
    "/login": [],
    "/sagas": [
        "type",
        "status",
        "state",
        "older_than",
        "after",
        "outcome",
        "correlation",
        "attr",
        "refresh",
    ],
    "/stuck": ["older_than", "type", "refresh"],
    "/search": ["saga_id"],
    "/saga/{saga_type}/{saga_id}": [],
    "/api/saga/{saga_type}/{saga_id}": [],
    "/dead-letters": ["before"],
    "/dead-letters/{row_id:int}": [],
    "/failed-outbox": [],
    "/audit": ["batch"],
    "/cluster": [],
    "/healthz": [],
    "/readyz": [],
}
POSTS: dict[str, list[str]] = {
    "/login": ["name", "key"],
    "/logout": [],
    "/saga/{saga_type}/{saga_id}/{action}": [
        "reason",
        "token",
        "operator",
        "decision",
        "name",
        "force",
    ],
    "/dead-letters/{row_id:int}/{action}": ["reason", "token", "confirm"],
    "/failed-outbox/{row_id:int}/{action}": ["reason", "token", "confirm"],
    "/sagas/batch": [
        "action",
        "reason",
        "token",
        "operator",
        "confirm",
        "force",
        "type",
        "status",
        "state",
        "older_than",
        "outcome",
        "correlation",
        "attr",
    ],
}
BENIGN = {"saga_type": "order-saga", "saga_id": "o-1", "row_id": "1", "action": "cancel"}
# The batch form's action and a filter, so that a hostile value in another field reaches it.
FORM = {"reason": "fuzz", "force": "yes", "confirm": "yes", "action": "cancel", "type": "t"}


@pytest.fixture
def console(world: Orders) -> Iterator[tuple[str, list[Route]]]:  # noqa: F811 - the fixture
    from processor._bootstrap.adapters import tables_for
    from processor._postgres.connect import ensure_schema

    ensure_schema(world.settings.database.url.get_secret_value(), tables_for(world.settings))
    auth = Authenticator(keys={ADMIN[0]: (ADMIN[1], "admin")})
    app = create_app(Backend(world.settings, by="fuzz"), actions=True, auth=auth)
    with _serve(app) as base:
        yield base, [r for r in app.routes if isinstance(r, Route)]


def _path(template: str, hostile: str | None = None, at: str | None = None) -> str:
    path = template.replace(":int", "")
    for name, value in BENIGN.items():
        text = hostile if name == at and hostile is not None else value
        path = path.replace("{" + name + "}", quote(text, safe=""))
    return path


def _params(template: str) -> list[str]:
    return [n for n in BENIGN if "{" + n in template]


def _check(answer: httpx.Response, what: str) -> None:
    assert answer.status_code < 500, (what, answer.status_code, answer.text[:300])
    if answer.headers.get("content-type", "").startswith("text/html"):
        assert MARKUP not in answer.text, what
        assert ATTRIBUTE not in answer.text, what


def test_the_table_names_every_route_of_the_console(
    console: tuple[str, list[Route]],
) -> None:
    _, routes = console
    served = {(r.path, m) for r in routes for m in (r.methods or ()) if m != "HEAD"}
    listed = {(p, "GET") for p in GETS} | {(p, "POST") for p in POSTS}
    assert served == listed


@pytest.mark.parametrize("signed_in", [False, True], ids=["anonymous", "admin"])
def test_no_hostile_value_gets_a_server_error_or_unescaped_markup(
    console: tuple[str, list[Route]], signed_in: bool
) -> None:
    base, _ = console
    with FormClient(base) as client:
        if signed_in:
            assert client.sign_in(*ADMIN).status_code == 303
        token = client.token()
        for template, params in GETS.items():
            for value in HOSTILE:
                for name in _params(template):
                    what = f"GET {template} {name}"
                    _check(_send(client, "GET", _path(template, value, name)), what)
                for name in params:
                    url = f"{_path(template)}?{name}={quote(value, safe='')}"
                    _check(_send(client, "GET", url), f"GET {template}?{name}")
        for template, fields in POSTS.items():
            for value in HOSTILE:
                for name in _params(template):
                    path = _path(template, value, name)
                    answer = _send(client, "POST", path, {**FORM, "csrf": token})
                    _check(answer, f"POST {template} {name}")
                for name in fields:
                    data = {**FORM, name: value, "csrf": token}
                    answer = client.http.post(_path(template), data=data)
                    _check(answer, f"POST {template} {name}")


def _send(
    client: FormClient, method: str, url: str, data: dict[str, str] | None = None
) -> httpx.Response:
    if len(url) < 60_000:
        return client.http.request(method, url, data=data)
    # httpx builds no URL this long; a browser or a script may send one all the same.
    host, port = str(client.http.base_url.host), client.http.base_url.port
    assert port is not None
    body = urlencode(data or {}).encode()
    head = (
        f"{method} {url} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
        f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(head.encode() + body)
        first = s.makefile("rb").readline().decode("latin-1")
    # The HTTP server reads a request head of 64 KiB at most (h11's bound): past it, it answers
    # 4xx or hangs up before the console sees anything.
    status = int(first.split()[1]) if first.startswith("HTTP/") else 400
    return httpx.Response(status)
