"""Each role sees exactly the action forms it may use, in headless Chromium.

With per-operator keys: someone not signed in sees no form (and no field for a key) but a link
to sign in, a viewer sees none, an operator exactly the operator actions, an admin all of them,
on a parked saga, an active one with a pending deadline, the dead letters, the failed outbox and
the sagas list (its batch form is an admin's).
A script still sends a key with an action's POST.
"""

from __future__ import annotations

import uuid

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from processor._console.auth import ACTION_ROLES
from sagas.order import OrderSaga
from schemas.orders import StockReserved
from tests.integration.test_console import _db, world  # noqa: F401 - the fixture
from tests.integration.test_console_roles import KEYS, _sign_in, _sign_out, console  # noqa: F401
from tests.integration.test_parking import EVENTS, ItemAdded, OrderClosed, PackingSaga, Warehouse
from tests.integration.test_parking import SAGA_TYPE as PACKING
from tests.integration.test_parking import OrderPlaced as PackingPlaced
from tests.support.browser import chromium, screenshot
from tests.support.console import FormClient
from tests.support.harness import running, wait_until
from tests.support.orders import Orders

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _action(path: str) -> str:
    """The action a form posts, as ACTION_ROLES names it."""
    last = path.rsplit("/", 1)[-1]
    return "outbox-retry" if path.startswith("/failed-outbox/") and last == "retry" else last


def _forms(b: WebDriver, base: str, pages: list[str]) -> set[tuple[str, str]]:
    """(page, action) of every action form on ``pages``; none of them asks for a key."""
    found: set[tuple[str, str]] = set()
    for page in pages:
        b.get(base + page)
        assert not b.find_elements(By.CSS_SELECTOR, "input[name='token']"), page
        for form in b.find_elements(By.CSS_SELECTOR, "main form[method='post']"):
            path = str(form.get_attribute("action")).removeprefix(base)
            found.add((page, _action(path)))
    return found


def test_each_role_sees_only_the_actions_it_may_take(
    world: Orders,  # noqa: F811 - the fixture above
    console: str,  # noqa: F811 - the fixture above
) -> None:
    o = world
    order, packing = f"ord-{uuid.uuid4().hex[:6]}", f"pack-{uuid.uuid4().hex[:6]}"
    events = o.settings.topic_prefix + EVENTS
    warehouse = Warehouse("glass")
    with running(o.settings, [OrderSaga, PackingSaga], dependencies={Warehouse: warehouse}):
        o.place(order)
        o.send(StockReserved(order_id=order), order)  # now charging, a payment deadline pending
        o.wait_version(order, 2)
        for event in (PackingPlaced(order_id=packing), ItemAdded(order_id=packing, item="glass")):
            o.pub.event(events, packing, event)
        o.pub.event(events, packing, OrderClosed(order_id=packing))
        o.pub.raw(events, b"junk", b"\xff not json", [("message-type", b"nope")])
        o.pub.flush()
        parked = "SELECT status FROM saga_instance WHERE saga_id = %s"
        wait_until(lambda: _db(o, parked, packing) == [("parked",)], 60, "the packing saga parked")
        wait_until(lambda: _db(o, "SELECT count(*) FROM dead_letter")[0][0] >= 1, 60, "a letter")
    [(failed,)] = _db(
        o,
        "INSERT INTO failed_outbox (id, saga_type, saga_id, topic, headers, value, created_at,"
        " reason, attempts) VALUES (9000001, 'order-saga', %s, 'commands',"
        """ '{"message-id": "m-1"}', '{}', now(), 'too large', 1) RETURNING id""",
        order,
    )
    [(dead,)] = _db(o, "SELECT min(id) FROM dead_letter")
    pages = [f"/saga/{PACKING}/{packing}", f"/saga/order-saga/{order}"]
    pages += ["/dead-letters", "/failed-outbox", "/sagas?type=order-saga"]

    with chromium() as b:
        # Nobody signed in: no form, a link to sign in on each page that has something to act on.
        assert _forms(b, console, pages) == set()
        for page in pages:
            b.get(console + page)
            assert b.find_element(By.ID, "sign-in-to-act").text == "sign in to act", page
        screenshot(b, "anonymous-failed-outbox")
        seen: dict[str, set[tuple[str, str]]] = {}
        for name in ("vera", "olga", "ada"):
            _sign_in(b, console, name)
            seen[name] = _forms(b, console, pages)
            assert not b.find_elements(By.ID, "sign-in-to-act")  # signed in: no link
            screenshot(b, f"{name}-failed-outbox")
            _sign_out(b)

    everything = seen["ada"]
    expected = {
        (pages[0], "retry"),
        (pages[0], "skip"),
        (pages[1], "cancel"),
        (pages[1], "terminate"),
        (pages[1], "fire-now"),
        (pages[1], "cancel-deadline"),
        ("/dead-letters", "replay"),
        ("/dead-letters", "purge"),
        ("/failed-outbox", "outbox-retry"),
        ("/failed-outbox", "discard"),
        ("/sagas?type=order-saga", "batch"),
    }
    assert expected <= everything
    assert seen["vera"] == set()
    assert seen["olga"] == {f for f in everything if ACTION_ROLES[f[1]] == "operator"}
    assert {a for _, a in everything - seen["olga"]} == {"terminate", "purge", "discard", "batch"}

    # A script still sends an operator's own key with the POST: it acts as that operator.
    with FormClient(console) as script:
        key = {"reason": "x", "operator": "olga", "token": KEYS["olga"][0]}
        refused = script.post(f"/dead-letters/{dead}/purge", {**key, "confirm": "yes"})
        assert refused.status_code == 403
        assert "purge needs the admin role (olga)" in refused.text
        kept = script.post(f"/failed-outbox/{failed}/retry", key, follow_redirects=False)
    assert kept.status_code == 303
    assert "1 rows put back" in kept.headers["location"].replace("+", " ")
