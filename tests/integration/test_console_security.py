"""The console against a hostile client, over real HTTP (uvicorn as `saga-processor console`
serves it) and, where a browser decides, in headless Chromium.

Each test is one finding of a probe: an address passing as the trusted proxy, a request from
another origin acting with an operator's cookie, guessing keys without limit, a session that
outlives its sign-out, bad parameters answered with a bare 500, and a signature shown to viewers.
"""

from __future__ import annotations

import http.server
import logging
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from processor._console import Backend, create_app
from processor._console.auth import COOKIE, Authenticator
from processor._console.protect import FORM_COOKIE
from sagas.order import OrderSaga
from tests.integration.test_console import _db, _free_port, _serve, world  # noqa: F401 - fixture
from tests.support.browser import chromium
from tests.support.console import FormClient
from tests.support.harness import running, wait_until
from tests.support.orders import Orders

pytestmark = [pytest.mark.integration]

OLGA = ("olga", "olga-key-0123456789")
ADA = ("ada", "ada-key-0123456789")
KEYS = {OLGA[0]: (OLGA[1], "operator"), ADA[0]: (ADA[1], "admin")}
PROXY = "127.0.0.2"
ROOT = [("X-Forwarded-User", "root")]


def _auth(**kw: object) -> Authenticator:
    return Authenticator(
        keys=KEYS,  # type: ignore[arg-type]
        trusted_proxies=[PROXY],
        proxy_roles={"root": "admin"},
        **kw,  # type: ignore[arg-type]
    )


@contextmanager
def _console(o: Orders, auth: Authenticator | None = None) -> Iterator[str]:
    """The console with actions on over ``o``'s (migrated) database; yields its base URL."""
    from processor._bootstrap.adapters import tables_for
    from processor._postgres.connect import ensure_schema

    ensure_schema(o.settings.database.url.get_secret_value(), tables_for(o.settings))
    app = create_app(Backend(o.settings, by="console-test"), actions=True, auth=auth or _auth())
    with _serve(app) as base:
        yield base


def _from(address: str) -> httpx.HTTPTransport:
    """Connections that leave from ``address`` (any of 127.0.0.0/8 is this machine)."""
    return httpx.HTTPTransport(local_address=address)


def test_an_address_that_names_the_proxy_in_x_forwarded_for_is_not_the_proxy(
    world: Orders,  # noqa: F811 - the fixture above
) -> None:
    o = world
    with _console(o) as base:
        spoof = {"X-Forwarded-For": PROXY, "X-Forwarded-User": "root"}
        with FormClient(base, headers=spoof) as mallory:
            page = mallory.http.get("/")
            assert 'id="identity"' not in page.text
            acted = mallory.post("/saga/order-saga/o-1/terminate", {"reason": "x", "force": "yes"})
            assert acted.status_code == 403
            assert "needs the admin role (nobody signed in)" in acted.text
        # The proxy itself, connecting from its own address, is believed.
        with FormClient(base, headers=dict(ROOT), transport=_from(PROXY)) as proxy:
            assert '<span id="identity">root (admin)</span>' in proxy.http.get("/").text


def test_a_request_from_another_origin_does_not_act(
    world: Orders,  # noqa: F811 - the fixture above
) -> None:
    o = world
    with _console(o) as base:
        with FormClient(base) as olga:
            assert olga.sign_in(*OLGA).status_code == 303
            cancel = "/saga/order-saga/o-1/cancel"
            for header in (
                {"Origin": "https://evil.example"},
                {"Origin": "null"},
                {"Sec-Fetch-Site": "cross-site"},
                {"Sec-Fetch-Site": "same-site"},
            ):
                refused = olga.post(cancel, {"reason": "x"}, headers=header)
                assert refused.status_code == 403, header
                assert refused.text.startswith("refused: a "), refused.text
            # No form token of this browser's: refused too, whatever the origin says.
            for token in ("", "0" * 64):
                forged = olga.http.post(cancel, data={"reason": "x", "csrf": token})
                assert forged.status_code == 403
                assert "form's token" in forged.text
            # The console's own page posts, with its token and origin: the request goes on.
            own = olga.post(cancel, {"reason": "x"}, headers={"Origin": base})
            assert own.status_code == 303
            assert "cancel+refused" in own.headers["location"]  # no such saga: refused later
        with FormClient(base) as stranger:
            login = stranger.post(
                "/login", {"name": OLGA[0], "key": OLGA[1]}, headers={"Origin": "http://x.test"}
            )
            assert login.status_code == 403
            assert COOKIE not in login.cookies
        # Behind the proxy, whose header is an identity a forged page would carry along.
        with FormClient(base, headers=dict(ROOT), transport=_from(PROXY)) as proxied:
            refused = proxied.post(
                "/saga/order-saga/o-1/terminate",
                {"reason": "x", "force": "yes"},
                headers={"Origin": "https://evil.example"},
            )
            assert refused.status_code == 403


def test_a_page_on_another_origin_cannot_make_a_signed_in_browser_act(
    world: Orders,  # noqa: F811 - the fixture above
) -> None:
    """In Chromium: an admin signed in to the console opens a page served from another port of
    the same host (same site, so the strict cookie goes along); it posts a terminate."""
    o = world
    saga_id = f"ord-{uuid.uuid4().hex[:6]}"
    with (
        _console(o) as base,
        _attacker_page(f"{base}/saga/order-saga/{saga_id}/terminate") as evil,
        chromium() as b,
    ):
        b.get(base + "/login")
        form = b.find_element(By.ID, "login")
        form.find_element(By.NAME, "name").send_keys(ADA[0])
        form.find_element(By.NAME, "key").send_keys(ADA[1])
        form.find_element(By.TAG_NAME, "button").click()
        WebDriverWait(b, 20).until(lambda d: d.find_elements(By.ID, "identity"))
        b.get(evil)
        WebDriverWait(b, 20).until(lambda d: d.current_url.startswith(base))
        body = b.find_element(By.TAG_NAME, "body").text
        assert body.startswith("refused: a cross-site request (same-site)"), body
    # Nothing was asked of any saga: no operator request reached the audit trail.
    assert _db(o, "SELECT count(*) FROM saga_history WHERE saga_id = %s", saga_id) == [(0,)]


@contextmanager
def _attacker_page(target: str) -> Iterator[str]:
    """A page on another port that posts a hidden form to ``target`` as soon as it loads."""
    html = (
        f'<form id="f" method="post" action="{target}"><input name="reason" value="x">'
        '<input name="force" value="yes"></form><script>document.getElementById("f").submit()'
        "</script>"
    ).encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(html)

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", _free_port()), Page)
    thread = threading.Thread(target=server.serve_forever, name="attacker", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_wrong_keys_are_answered_429_and_logged_without_the_key(
    world: Orders,  # noqa: F811 - the fixture above
    caplog: pytest.LogCaptureFixture,
) -> None:
    o = world
    caplog.set_level(logging.WARNING, logger="processor._console")
    guesses = [f"guess-{n:02d}-0123456789" for n in range(20)]
    with _console(o) as base:
        with FormClient(base) as guesser:
            answers = [guesser.sign_in(OLGA[0], g).status_code for g in guesses]
            assert answers[:5] == [403] * 5
            assert answers[5:] == [429] * 15
            # Blocked means blocked: the right key waits too, so guessing gains nothing.
            right = guesser.sign_in(*OLGA)
            assert right.status_code == 429
            assert int(right.headers["Retry-After"]) >= 1
        # Another address is not held back by it, but the name is.
        with FormClient(base, transport=_from("127.0.0.3")) as other:
            assert other.sign_in(*ADA).status_code == 303
            assert other.sign_in(*OLGA).status_code == 429
        # The shared action key, sent with each action by someone not signed in, the same.
        with FormClient(base, transport=_from("127.0.0.4")) as token_guesser:
            tries = [
                token_guesser.post(
                    "/saga/order-saga/o-1/cancel",
                    {"reason": "x", "operator": ADA[0], "token": g},
                ).status_code
                for g in guesses
            ]
            assert tries[:5] == [403] * 5
            assert tries[5:] == [429] * 15
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "wrong key for 'olga' from 127.0.0.1 (1 in a row)" in logged
    assert "sign-in as 'olga' from 127.0.0.1 refused, throttled" in logged
    assert "wrong key for 'ada' from 127.0.0.4" in logged
    assert not any(g in logged for g in guesses)


def test_a_session_ends_on_sign_out_and_when_its_key_is_removed(
    world: Orders,  # noqa: F811 - the fixture above
) -> None:
    o = world
    auth = _auth()
    with _console(o, auth) as base:
        with FormClient(base) as olga:
            olga.sign_in(*OLGA)
            old = olga.http.cookies[COOKIE]
            assert "olga (operator)" in olga.http.get("/").text
            assert olga.post("/logout", {}).status_code == 303
        # The cookie kept by someone (a shared machine, a stolen copy) signs nobody in.
        with FormClient(base, cookies={COOKIE: old}) as replay:
            assert 'id="identity"' not in replay.http.get("/").text
            refused = replay.post("/saga/order-saga/o-1/cancel", {"reason": "x"})
            assert refused.status_code == 403
            assert "(nobody signed in)" in refused.text
        with FormClient(base) as ada:
            ada.sign_in(*ADA)
            assert "ada (admin)" in ada.http.get("/").text
            auth.remove_key(ADA[0])
            assert 'id="identity"' not in ada.http.get("/").text


def test_cookies_are_secure_behind_a_proxy_that_says_https_and_pages_carry_the_headers(
    world: Orders,  # noqa: F811 - the fixture above
) -> None:
    o = world
    with _console(o) as base:
        tls = {"X-Forwarded-Proto": "https"}
        with FormClient(base, headers=tls, transport=_from(PROXY)) as proxied:
            [form] = proxied.http.get("/login").headers.get_list("set-cookie")
            assert form.startswith(f"{FORM_COOKIE}=")
            assert "; Secure" in form
            # This client speaks plain HTTP behind the "proxy", so it keeps a Secure cookie to
            # itself; a browser on the proxy's https origin sends it back.
            proxied.http.cookies.set(FORM_COOKIE, form.split(";")[0].split("=", 1)[1])
            signed = proxied.sign_in(*OLGA)
            assert signed.status_code == 303
            cookies = signed.headers.get_list("set-cookie")
            assert any(c.startswith(f"{COOKIE}=") and "; Secure" in c for c in cookies)
        with FormClient(base, headers=tls) as direct:  # not the proxy: its word counts for nothing
            first = direct.http.get("/login").headers.get_list("set-cookie")
            assert any(c.startswith(f"{FORM_COOKIE}=") and "Secure" not in c for c in first)
            signed = direct.sign_in(*OLGA)
            assert not any("Secure" in c for c in signed.headers.get_list("set-cookie"))
        for path in ("/", "/login", "/sagas", "/dead-letters", "/nowhere", "/healthz"):
            headers = httpx.get(base + path).headers
            csp = headers["content-security-policy"]
            assert "frame-ancestors 'none'" in csp, path
            assert "script-src 'nonce-" in csp, path
            assert headers["x-content-type-options"] == "nosniff"
            assert headers["referrer-policy"] == "same-origin"
            assert headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/stuck?older_than=abc", "older_than"),
        ("/stuck?older_than=99999999999d", "older_than"),
        ("/sagas?older_than=1e400s", "older_than"),
        ("/sagas?status=nope", "status"),
        ("/sagas?outcome=nope", "outcome"),
        ("/sagas?after=no-cursor", "after"),
        ("/sagas?type=a%00b", "type"),
        ("/search?saga_id=%00", "saga_id"),
        ("/dead-letters?before=abc", "before"),
        ("/dead-letters?before=99999999999999999999999", "before"),
        ("/dead-letters/99999999999999999999999", "row id"),
        ("/saga/order-saga/x%00y", "path"),
        ("/api/saga/order-saga/x%00y", "path"),
        ("/sagas?attr=" + "x" * 3000, "attr"),
    ],
)
def test_a_bad_parameter_is_answered_400_naming_it(
    world: Orders,  # noqa: F811 - the fixture above
    path: str,
    named: str,
) -> None:
    with _console(world) as base:
        answer = httpx.get(base + path, timeout=30)
    assert answer.status_code == 400, answer.text[:300]
    assert re.search(rf"bad parameter {re.escape(named)}\b", answer.text), answer.text[:300]


def test_no_one_sees_a_header_that_authorises_an_operator_request(
    world: Orders,  # noqa: F811 - the fixture above
) -> None:
    """A dead-lettered operator record keeps its headers; the signature's value is shown to no
    one, viewers included, though the page says it was there."""
    o = world
    signature = "5e" * 32
    with running(o.settings, [OrderSaga]):
        o.pub.raw(
            o.settings.topic_prefix + "order-events",
            b"o-1",
            b'{"action": "cancel"}',
            [
                ("message-id", b"operator:forged"),
                ("message-type", b"saga.operator-command"),
                ("operator-auth", signature.encode()),
            ],
        )
        o.pub.flush()
        [(dead,)] = wait_until(
            lambda: _db(
                o, "SELECT id FROM dead_letter WHERE headers->>'message-id' = 'operator:forged'"
            ),
            60,
            "the forged operator record dead-lettered",
        )
    with _console(o) as base:
        viewer = httpx.get(f"{base}/dead-letters/{dead}").text
        with FormClient(base) as ada:
            ada.sign_in(*ADA)
            admin = ada.http.get(f"/dead-letters/{dead}").text
    for page in (viewer, admin):
        assert signature not in page
        assert '"operator-auth": "(hidden)"' in page.replace("&#34;", '"')
