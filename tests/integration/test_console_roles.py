"""Who may do what in the console, in headless Chromium: a viewer, an operator, an admin.

Operators sign in with their own keys. A viewer reads but sees no state or payload and no action,
and an action posted anyway is refused; an operator retries a parked saga and its timeline names
them; an admin purges a dead letter; the audit list shows both with their names and reasons.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from processor._console import Backend, create_app
from processor._console.auth import COOKIE, Authenticator
from tests.integration.test_console import _db, _serve, world  # noqa: F401 - the fixture
from tests.integration.test_parking import (
    EVENTS,
    ItemAdded,
    OrderClosed,
    PackingSaga,
    Warehouse,
)
from tests.integration.test_parking import SAGA_TYPE as PACKING
from tests.integration.test_parking import OrderPlaced as PackingPlaced
from tests.support.browser import chromium, screenshot
from tests.support.console import FormClient
from tests.support.harness import running, wait_until
from tests.support.orders import Orders

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEYS = {
    "vera": ("vera-key-0123456789", "viewer"),
    "olga": ("olga-key-0123456789", "operator"),
    "ada": ("ada-key-0123456789", "admin"),
}


@pytest.fixture
def console(world: Orders) -> Iterator[str]:  # noqa: F811 - the fixture above
    auth = Authenticator(keys=KEYS)  # type: ignore[arg-type]
    with _serve(create_app(Backend(world.settings), actions=True, auth=auth)) as base:
        yield base


def _sign_in(b: WebDriver, base: str, name: str) -> None:
    b.get(base + "/login")
    form = b.find_element(By.ID, "login")
    form.find_element(By.NAME, "name").send_keys(name)
    form.find_element(By.NAME, "key").send_keys(KEYS[name][0])
    form.find_element(By.TAG_NAME, "button").click()
    WebDriverWait(b, 20).until(lambda d: d.find_elements(By.ID, "identity"))
    assert b.find_element(By.ID, "identity").text == f"{name} ({KEYS[name][1]})"


def _sign_out(b: WebDriver) -> None:
    b.find_element(By.CSS_SELECTOR, "form.who button").click()
    WebDriverWait(b, 20).until(lambda d: d.find_elements(By.ID, "sign-in"))


def test_a_viewer_reads_an_operator_retries_an_admin_purges(
    world: Orders,  # noqa: F811 - the fixture above
    console: str,
) -> None:
    o = world
    packing = f"pack-{uuid.uuid4().hex[:6]}"
    events = o.settings.topic_prefix + EVENTS
    warehouse = Warehouse("glass")
    with running(o.settings, [PackingSaga], dependencies={Warehouse: warehouse}):
        for event in (
            PackingPlaced(order_id=packing),
            ItemAdded(order_id=packing, item="glass"),
            OrderClosed(order_id=packing),
        ):
            o.pub.event(events, packing, event)
        o.pub.raw(events, b"junk", b"\xff not json", [("message-type", b"nope")])
        o.pub.flush()
        wait_until(
            lambda: (
                _db(o, "SELECT status FROM saga_instance WHERE saga_id = %s", packing)
                == [("parked",)]
            ),
            60,
            "the packing saga parked",
        )
        wait_until(
            lambda: _db(o, "SELECT count(*) FROM dead_letter")[0][0] >= 1, 60, "a dead letter"
        )
        [(dead,)] = _db(o, "SELECT min(id) FROM dead_letter")
        page = f"{console}/saga/{PACKING}/{packing}"

        with chromium() as b:
            wait = WebDriverWait(b, 20)
            # A viewer: the saga, but not its state, and no action.
            _sign_in(b, console, "vera")
            b.get(page)
            assert b.find_element(By.ID, "status").text == "parked"
            assert b.find_elements(By.ID, "state-hidden")
            assert not b.find_elements(By.ID, "state")
            assert not b.find_elements(By.ID, "form-retry")
            b.get(f"{console}/dead-letters/{dead}")
            assert b.find_elements(By.ID, "value-hidden")
            screenshot(b, "viewer-saga")
            # Posted anyway, with the viewer's session: refused, and nothing was sent.
            session = {COOKIE: b.get_cookie(COOKIE)["value"]}  # type: ignore[index]
            with FormClient(console, cookies=session) as as_vera:
                refused = as_vera.post(f"{page}/retry", {"reason": "x"})
            assert refused.status_code == 403
            assert "needs the operator role (vera)" in refused.text
            api = httpx.get(f"{console}/api/saga/{PACKING}/{packing}", cookies=session).json()
            assert api["state"] is None
            _sign_out(b)

            # An operator: retries the parked saga once it can go on; the timeline names them.
            warehouse.broken.clear()
            _sign_in(b, console, "olga")
            b.get(page)
            assert b.find_elements(By.ID, "state")
            assert not b.find_elements(By.ID, "form-terminate")  # an admin's action
            form = b.find_element(By.ID, "form-retry")
            assert not form.find_elements(By.NAME, "token")  # signed in: no key to retype
            form.find_element(By.NAME, "reason").send_keys("warehouse fixed")
            form.find_element(By.TAG_NAME, "button").click()
            wait.until(lambda d: d.find_elements(By.ID, "notice"))
            assert "retry applied, now ended" in b.find_element(By.ID, "notice").text
            assert "by olga: warehouse fixed" in b.find_element(By.ID, "timeline").text
            b.get(console + "/dead-letters")
            assert not b.find_elements(
                By.CSS_SELECTOR, f"form[action='/dead-letters/{dead}/purge']"
            )
            _sign_out(b)

            # An admin: purges the dead letter; the audit trail has who, what and why.
            _sign_in(b, console, "ada")
            admin = {COOKIE: b.get_cookie(COOKIE)["value"]}  # type: ignore[index]
            with FormClient(console, cookies=admin) as as_ada:
                unconfirmed = as_ada.post(f"/dead-letters/{dead}/purge", {"reason": "x"})
            assert unconfirmed.status_code == 400
            assert "cannot be undone" in unconfirmed.text
            b.get(console + "/dead-letters")
            form = b.find_element(By.CSS_SELECTOR, f"form[action='/dead-letters/{dead}/purge']")
            form.find_element(By.NAME, "reason").send_keys("junk from a test")
            form.find_element(By.NAME, "confirm").click()  # it cannot be undone
            form.find_element(By.TAG_NAME, "button").click()
            wait.until(lambda d: d.find_elements(By.ID, "notice"))
            assert f"dead letter {dead}: purge done" in b.find_element(By.ID, "notice").text
            # The audit list: the admin's purge and the operator's retry, by their names.
            b.get(console + "/audit")
            rows = [
                tuple(r.find_element(By.CLASS_NAME, c).text for c in ("actor", "action", "reason"))
                for r in b.find_elements(By.CSS_SELECTOR, "#audit tr.audit-row")
            ]
            assert ("ada", "dead-letter-purge", "junk from a test") in rows
            assert ("olga", "parked-retry", "warehouse fixed") in rows
            screenshot(b, "audit")
