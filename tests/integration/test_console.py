"""The web console over data the engine produced, driven in headless Chromium.

A processor runs the order saga and a packing saga whose warehouse refuses one item; the console
serves the same database. The browser searches an order, opens it and sees its timeline and its
current state highlighted in the diagram; then, with actions enabled, it retries the parked
packing saga once its warehouse is fixed (the request goes to the running processor as an
operator record) and sees it finish. Each page is saved under `.local/console/`.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from pydantic import SecretStr
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from processor._console import Backend, create_app
from processor._console.serve import server_config
from processor.settings import ProcessorSettings
from sagas.order import OrderSaga
from schemas.orders import StockReserved
from tests.integration.test_parking import (
    COMMANDS,
    EVENTS,
    ItemAdded,
    OrderClosed,
    PackingSaga,
    Warehouse,
)
from tests.integration.test_parking import (
    SAGA_TYPE as PACKING,
)
from tests.integration.test_parking import (
    OrderPlaced as PackingPlaced,
)
from tests.support.browser import chromium, screenshot
from tests.support.console import FormClient
from tests.support.harness import Publisher, create_topics, query, running, settings_for, wait_until
from tests.support.orders import Orders

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "console-test-token"


@pytest.fixture
def world(kafka_bootstrap: str, database_url: str, pg_schema: str) -> Orders:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    names = ("order-events", "order-commands", "escalations", "saga-dead-letters", EVENTS, COMMANDS)
    create_topics(kafka_bootstrap, [prefix + n for n in names])
    settings = settings_for(
        kafka_bootstrap,
        database_url,
        pg_schema,
        prefix,
        sagas=["sagas.order:OrderSaga", "tests.integration.test_parking:PackingSaga"],
        settings={"order.payment-timeout": "PT10M"},
        operator={"key": "k", "name": "console-test"},
    )
    return Orders(settings, Publisher(kafka_bootstrap))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def console(world: Orders) -> Iterator[str]:
    """The console, actions on, served by uvicorn in a thread; yields its base URL."""
    with _serve(
        create_app(Backend(world.settings, by="browser"), actions=True, token=TOKEN)
    ) as base:
        yield base


@contextmanager
def _serve(app: Any) -> Iterator[str]:
    port = _free_port()
    server = uvicorn.Server(server_config(app, "127.0.0.1", port))
    thread = threading.Thread(target=server.run, name="console", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: server.started, timeout=30, what="console started")
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(30)


def _db(o: Orders, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    s: ProcessorSettings = o.settings
    return query(s.database.url.get_secret_value(), s.database.schema_name, sql, *args)


def test_an_operator_finds_a_saga_and_retries_a_parked_one_in_the_browser(
    world: Orders, console: str
) -> None:
    o = world
    order, packing = f"ord-{uuid.uuid4().hex[:6]}", f"pack-{uuid.uuid4().hex[:6]}"
    packing_events = o.settings.topic_prefix + EVENTS
    warehouse = Warehouse("glass")
    with running(o.settings, [OrderSaga, PackingSaga], dependencies={Warehouse: warehouse}):
        o.place(order)
        o.send(StockReserved(order_id=order), order)
        o.wait_version(order, 2)
        for event in (
            PackingPlaced(order_id=packing),
            ItemAdded(order_id=packing, item="cup"),
            ItemAdded(order_id=packing, item="glass"),
            OrderClosed(order_id=packing),
        ):
            o.pub.event(packing_events, packing, event)
        # And one record nobody can read: a dead letter.
        o.pub.raw(packing_events, b"junk", b"\xff not json", [("message-type", b"nope")])
        o.pub.flush()
        wait_until(
            lambda: (
                _db(o, "SELECT count(*) FROM parked_message WHERE saga_id = %s", packing)[0][0] == 2
            ),
            timeout=60,
            what="packing saga parked with two held messages",
        )
        wait_until(
            lambda: _db(o, "SELECT count(*) FROM dead_letter")[0][0] >= 1,
            timeout=60,
            what="a dead letter",
        )
        machine_state = _db(o, "SELECT machine_state FROM saga_instance WHERE saga_id = %s", order)
        [(state,)] = machine_state

        with chromium() as b:
            wait = WebDriverWait(b, 20)
            b.get(console + "/")
            assert b.find_element(By.ID, "parked-count").text == "1"
            # The processor keeps up: its stored positions are at the broker's watermarks.

            def lag() -> str:
                b.get(console + "/")
                return str(b.find_element(By.ID, "consumer-lag").text)

            wait_until(lambda: lag() == "0", timeout=30, what="no consumer lag")
            assert b.find_elements(By.CSS_SELECTOR, "#lag tr")
            screenshot(b, "overview")

            # Search by id: one match opens the saga.
            box = b.find_element(By.ID, "search")
            box.send_keys(order)
            box.submit()
            wait.until(lambda d: d.find_elements(By.ID, "saga-id"))
            assert b.find_element(By.ID, "saga-id").text == order
            steps = b.find_elements(By.CSS_SELECTOR, "#timeline tr.step .message-type")
            assert [s.text.splitlines()[0] for s in steps] == [
                "orders.OrderPlaced",
                "orders.StockReserved",
            ]
            assert "sent orders.CapturePayment" in b.find_element(By.ID, "timeline").text
            # The saga's own name for where it is, inside the canonical state.
            assert b.find_element(By.ID, "step-state").text == "CHARGING"
            current = b.find_elements(By.CSS_SELECTOR, "#diagram g.state.current")
            assert [c.get_attribute("data-state") for c in current] == [state]
            assert len(b.find_elements(By.CSS_SELECTOR, "#diagram g.state")) >= 6
            screenshot(b, "saga-detail")

            b.get(console + "/stuck?older_than=0s")
            assert order in b.find_element(By.ID, "sagas").text
            screenshot(b, "stuck")

            b.get(console + "/dead-letters")
            assert "unknown-type" in b.find_element(By.ID, "dead-letters").text
            screenshot(b, "dead-letters")

            b.get(console + "/failed-outbox")
            b.find_element(By.ID, "failed-outbox")
            screenshot(b, "failed-outbox")

            # The parked saga: once the warehouse is fixed, retried from its page, it finishes
            # (the retry is an operator record the running processor applies).
            warehouse.broken.clear()
            b.get(f"{console}/saga/{PACKING}/{packing}")
            assert b.find_element(By.ID, "status").text == "parked"
            assert "warehouse cannot take glass" in b.find_element(By.ID, "parked-reason").text
            screenshot(b, "parked-saga")
            # Nobody signed in sees no form, only where to sign in: with the shared token, as
            # the operator name it stands for.
            assert not b.find_elements(By.ID, "form-retry")
            b.find_element(By.ID, "sign-in-to-act").click()
            login = b.find_element(By.ID, "login")
            login.find_element(By.NAME, "name").send_keys("browser")
            login.find_element(By.NAME, "key").send_keys(TOKEN)
            login.find_element(By.TAG_NAME, "button").click()
            wait.until(lambda d: d.find_elements(By.ID, "identity"))
            b.get(f"{console}/saga/{PACKING}/{packing}")
            form = b.find_element(By.ID, "form-retry")
            assert not form.find_elements(By.NAME, "token")
            form.find_element(By.NAME, "reason").send_keys("warehouse fixed")
            form.find_element(By.TAG_NAME, "button").click()
            wait.until(lambda d: d.find_elements(By.ID, "notice"))
            assert "retry applied, now ended" in b.find_element(By.ID, "notice").text
            assert b.find_element(By.ID, "status").text == "ended"
            timeline = b.find_element(By.ID, "timeline").text
            assert "operator:parked-retry" in timeline
            assert "by browser: warehouse fixed" in timeline
            screenshot(b, "parked-saga-retried")

            # The order: terminating it says first that nothing will be undone.
            b.get(f"{console}/saga/order-saga/{order}")
            assert "nothing it did is undone" in b.find_element(By.ID, "terminate-warning").text
            form = b.find_element(By.ID, "form-terminate")
            form.find_element(By.NAME, "force").click()
            form.find_element(By.NAME, "reason").send_keys("test order")
            form.find_element(By.TAG_NAME, "button").click()
            wait.until(lambda d: d.find_elements(By.ID, "notice"))
            assert "terminate applied, now ended" in b.find_element(By.ID, "notice").text
            assert "no compensation ran" in b.find_element(By.ID, "timeline").text
            assert b.find_element(By.ID, "outcome").text == "TERMINATED"
            screenshot(b, "order-terminated")
            # Ended sagas are found by how they ended.
            b.get(console + "/sagas")
            form = b.find_element(By.ID, "filter")
            form.find_element(By.NAME, "state").send_keys("TERMINATED")
            form.find_element(By.TAG_NAME, "button").click()
            wait.until(lambda d: "state=TERMINATED" in d.current_url)
            rows = b.find_elements(By.CSS_SELECTOR, "#sagas tr")[1:]
            assert [r.find_elements(By.TAG_NAME, "td")[1].text for r in rows] == [order]


def test_actions_need_the_token(world: Orders, console: str) -> None:
    from processor._bootstrap.adapters import tables_for
    from processor._postgres.connect import ensure_schema

    ensure_schema(world.settings.database.url.get_secret_value(), tables_for(world.settings))
    with FormClient(console) as client:
        refused = client.post(f"/saga/{PACKING}/nobody/retry", {"reason": "x", "token": "wrong"})
        assert refused.status_code == 403
        page = httpx.get(f"{console}/saga/{PACKING}/nobody")
        assert page.status_code == 404
        # Terminate undoes nothing: without the box ticked it is refused before anything is sent.
        unforced = client.post(f"/saga/{PACKING}/nobody/terminate", {"reason": "x", "token": TOKEN})
    assert unforced.status_code == 303
    assert "terminate+refused" in unforced.headers["location"]


def test_consumer_lag_is_unknown_when_the_broker_is_unreachable(world: Orders) -> None:
    from processor._bootstrap.adapters import tables_for
    from processor._postgres.connect import ensure_schema

    ensure_schema(world.settings.database.url.get_secret_value(), tables_for(world.settings))
    # Nothing listens on port 1: the broker cannot be asked.
    kafka = world.settings.kafka.model_copy(update={"bootstrap_servers": "127.0.0.1:1"})
    away = world.settings.model_copy(update={"kafka": kafka})
    backend = Backend(away, by="browser")
    assert backend.consumer_lag(timeout=1.0) is None
    with _serve(create_app(backend)) as base:
        page = httpx.get(base + "/", timeout=30)
    assert page.status_code == 200
    assert '<b id="consumer-lag">unknown</b>' in page.text


def test_pages_answer_503_in_one_line_while_the_database_is_away(
    world: Orders, caplog: pytest.LogCaptureFixture
) -> None:
    # Nothing listens on port 1: every connection to the database is refused.
    url = SecretStr("postgresql://saga:saga@127.0.0.1:1/saga")
    database = world.settings.database.model_copy(update={"url": url})
    away = world.settings.model_copy(update={"database": database})
    caplog.set_level(logging.WARNING)
    # uvicorn's own log does not reach the root logger: catch its tracebacks too.
    server_log = logging.getLogger("uvicorn")
    server_log.addHandler(caplog.handler)
    try:
        with _serve(create_app(Backend(away, by="browser"))) as base:
            answers = {
                path: httpx.get(base + path, timeout=30)
                for path in ("/", "/sagas", "/saga/x/y", "/api/saga/x/y", "/dead-letters")
            }
            alive = httpx.get(base + "/healthz", timeout=30)
            ready = httpx.get(base + "/readyz", timeout=30)
    finally:
        server_log.removeHandler(caplog.handler)
    for path, answer in answers.items():
        assert answer.status_code == 503, (path, answer.text[:300])
        if path.startswith("/api/"):
            assert answer.json() == {"error": "the database is unreachable"}
        else:
            assert answer.text == "the database is unreachable", path
    assert (alive.status_code, alive.text) == (200, "ok")
    assert ready.status_code == 503
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    warned = [r.getMessage() for r in caplog.records if r.name == "processor._console.outage"]
    assert len(warned) == len(answers)
    assert all("answered 503: the database is unreachable: " in w for w in warned), warned
    assert all("\n" not in w for w in warned)


def test_the_cluster_page_and_the_saga_filters_in_the_browser(world: Orders) -> None:
    """The cluster page shows the running replica as the partition's owner and lease holder, its
    auto-refresh reloads it, and the sagas list narrows by outcome, correlation id and state."""
    from decimal import Decimal

    from selenium.webdriver.support.ui import Select

    from schemas.orders import OrderPlaced, StockUnavailable

    o = world
    tag = uuid.uuid4().hex[:6]
    kept, refused, conversation = f"ord-{tag}-kept", f"ord-{tag}-refused", f"conv-{tag}"
    with running(o.settings, [OrderSaga]) as processor:
        for order, customer in ((kept, f"c-{tag}"), (refused, "c-other")):
            placed = OrderPlaced(
                order_id=order, customer_id=customer, sku="mug", quantity=1, amount=Decimal("3.50")
            )
            o.pub.event(o.events, order, placed, **{"correlation-id": conversation})
        o.pub.flush()
        o.wait_version(kept, 1)
        o.send(StockUnavailable(order_id=refused, reason="none left"), refused)
        o.wait_status(refused, "ended")
        wait_until(
            lambda: (
                _db(o, "SELECT holder FROM saga_deadline_lock WHERE expires_at > now()")
                == [(processor.instance_id,)]
            ),
            timeout=30,
            what="the deadline lease held",
        )
        # A viewer may not search the state unless payloads are shown to everyone.
        backend = Backend(o.settings, by="browser")
        with _serve(create_app(backend, show_payloads=True)) as base, chromium() as b:
            b.get(base + "/cluster")
            [row] = b.find_elements(By.CSS_SELECTOR, "#partitions tr.partition")
            assert row.find_element(By.CLASS_NAME, "owner").text == processor.instance_id
            assert b.find_element(By.ID, "lease-holder-name").text == processor.instance_id
            assert b.find_element(By.ID, "lease-expiry").text.startswith("in ")
            assert b.find_element(By.ID, "total-lag").text.isdigit()
            # Replicas of other groups on this database (tests running beside this one) are
            # listed when connected, owning none of this group's partitions: one owner here.
            rows = b.find_elements(By.CSS_SELECTOR, "#replicas tr.replica")
            [owner] = [r for r in rows if r.find_element(By.CLASS_NAME, "num").text != "0"]
            assert owner.find_element(By.CLASS_NAME, "instance").text == processor.instance_id
            assert owner.find_element(By.CLASS_NAME, "num").text == "1"
            screenshot(b, "cluster")

            # Auto-refresh: off by default; on, the page reloads itself.
            box = b.find_element(By.ID, "auto-refresh")
            assert not box.is_selected()
            Select(b.find_element(By.ID, "refresh-every")).select_by_value("5")
            box.click()
            WebDriverWait(b, 10).until(lambda d: "refresh=5" in d.current_url)
            b.execute_script("window.notReloaded = true")
            WebDriverWait(b, 15).until(
                lambda d: d.execute_script("return window.notReloaded === undefined")
            )
            assert b.find_element(By.ID, "auto-refresh").is_selected()

            def listed(**query: str) -> list[str]:
                b.get(base + "/sagas")
                form = b.find_element(By.ID, "filter")
                for name, value in query.items():
                    field = form.find_element(By.NAME, name)
                    if field.tag_name == "select":
                        Select(field).select_by_visible_text(value)
                    else:
                        field.send_keys(value)
                form.find_element(By.TAG_NAME, "button").click()
                WebDriverWait(b, 10).until(lambda d: f"{name}=" in d.current_url)
                rows = b.find_elements(By.CSS_SELECTOR, "#sagas a.saga-link")
                return sorted(r.text for r in rows)

            assert listed(correlation=conversation) == [kept, refused]
            assert listed(correlation=conversation, outcome="FAILED") == [refused]
            assert listed(attr=f"customer_id=c-{tag}") == [kept]
            assert listed(attr="amount=3.50", correlation=conversation) == [kept, refused]
            screenshot(b, "sagas-filtered")


def test_a_saga_functions_journal_in_the_browser(
    kafka_bootstrap: str, database_url: str, pg_schema: str
) -> None:
    """A trip written as a function, run by the processor: its page lists each resolved await
    and the one it waits on with its timer; why it is undoing shows to a signed-in operator
    only, as the state does."""
    from datetime import datetime
    from decimal import Decimal

    from sagas.trip_function import trip_function
    from schemas import trips

    prefix = f"t{uuid.uuid4().hex[:8]}."
    names = ("trip-events", "trip-commands", "escalations", "saga-dead-letters")
    create_topics(kafka_bootstrap, [prefix + n for n in names])
    settings = settings_for(
        kafka_bootstrap,
        database_url,
        pg_schema,
        prefix,
        sagas=["sagas.trip_function:trip_function"],
        operator={"key": "k", "name": "console-test"},
    )
    pub = Publisher(kafka_bootstrap)
    events = prefix + trips.TRIP_EVENTS_TOPIC
    tag = uuid.uuid4().hex[:6]
    charging, declined = f"trip-{tag}-charging", f"trip-{tag}-declined"
    url, schema = database_url, pg_schema

    def state(trip: str) -> dict[str, Any] | None:
        rows = query(url, schema, "SELECT state FROM saga_instance WHERE saga_id = %s", trip)
        return rows[0][0] if rows else None

    def journal_length(trip: str) -> int:
        found = state(trip)
        return len(found["journal"]) if found else -1

    with running(settings, [trip_function]):
        for trip in (charging, declined):
            booking = trips.TripRequested(
                trip_id=trip, traveller_id="ada", flight="LH 1", hotel="Adlon", amount=Decimal(9)
            )
            for event in (
                booking,
                trips.FlightReserved(trip_id=trip),
                trips.HotelReserved(trip_id=trip),
            ):
                pub.event(events, trip, event)
        pub.event(events, declined, trips.ChargeDeclined(trip_id=declined, reason="card refused"))
        pub.flush()
        # The charge waits 30 s for its reply: the page is read well within that.
        wait_until(lambda: journal_length(charging) == 2, timeout=60, what="charge sent")
        wait_until(lambda: journal_length(declined) == 3, timeout=60, what="charge declined")
        charging_state = state(charging)
        assert charging_state is not None
        timer = datetime.fromisoformat(charging_state["pending"]["timer_at"]).isoformat()

        backend = Backend(settings, by="browser")
        with _serve(create_app(backend, actions=True, token=TOKEN)) as base, chromium() as b:
            b.get(f"{base}/saga/trip-function/{charging}")
            rows = b.find_elements(By.CSS_SELECTOR, "#journal tr.await:not(.pending)")
            cells = [[td.text for td in r.find_elements(By.TAG_NAME, "td")][:6] for r in rows]
            assert cells == [
                ["0", "call", "trips.ReserveFlight", "ok", "1", "trips.FlightReserved"],
                ["1", "call", "trips.ReserveHotel", "ok", "1", "trips.HotelReserved"],
            ]
            pending = b.find_element(By.ID, "pending-await")
            assert pending.get_attribute("data-seq") == "2"
            assert "trips.ChargeTrip" in pending.text
            assert "waiting, times out" in pending.text
            assert b.find_element(By.ID, "pending-timer").text == timer
            assert "trips.TripCharged" in pending.text  # what it expects
            assert not b.find_elements(By.ID, "aborted")
            assert "a saga function" in b.find_element(By.ID, "diagram").text
            screenshot(b, "saga-function")

            # Undoing: a viewer sees that it is, not the refusal's words (the state is hidden).
            b.get(f"{base}/saga/trip-function/{declined}")
            outcomes = b.find_elements(By.CSS_SELECTOR, "#journal tr.await:not(.pending) .outcome")
            assert [o.text for o in outcomes] == ["ok", "ok", "rejected"]
            assert "trips.CancelHotel" in b.find_element(By.ID, "pending-await").text
            assert b.find_element(By.ID, "aborted").text == "Undoing what it did"
            assert b.find_element(By.ID, "state-hidden")
            api = httpx.get(f"{base}/api/saga/trip-function/{declined}", timeout=30).json()
            assert api["journal"]["compensating"] is True
            assert api["journal"]["aborted"] is None

            b.get(base + "/login")
            login = b.find_element(By.ID, "login")
            login.find_element(By.NAME, "name").send_keys("browser")
            login.find_element(By.NAME, "key").send_keys(TOKEN)
            login.find_element(By.TAG_NAME, "button").click()
            WebDriverWait(b, 20).until(lambda d: d.find_elements(By.ID, "identity"))
            b.get(f"{base}/saga/trip-function/{declined}")
            assert b.find_element(By.ID, "aborted").text == (
                "Undoing what it did: trips.ChargeTrip: card refused"
            )
            screenshot(b, "saga-function-undoing")

            # The hotel cannot be cancelled: a person is asked, and the page offers what an
            # undo can be told (send it again, or take it as done by hand), not a compensation.
            refused = trips.HotelCancelFailed(trip_id=declined, reason="desk closed")
            pub.event(events, declined, refused)
            pub.flush()
            wait_until(
                lambda: ((state(declined) or {}).get("pending") or {}).get("kind") == "decision",
                timeout=60,
                what="a person asked about the refused undo",
            )
            b.get(f"{base}/saga/trip-function/{declined}")
            pending = b.find_element(By.ID, "pending-await")
            assert "decision" in pending.text
            assert "waiting: undo trips.CancelHotel failed: desk closed" in pending.text
            sent = b.find_elements(By.CSS_SELECTOR, "#journal tr.await:not(.pending)")[-1]
            assert "send" in sent.text  # the escalation to the person, journaled
            assert "trips.EscalateTrip" in sent.text
            assert b.find_element(By.ID, "undo-escalated")
            form = b.find_element(By.ID, "form-resolve")
            options = form.find_elements(By.TAG_NAME, "option")
            assert [o.text for o in options] == ["retry", "skip"]
            screenshot(b, "saga-function-undo-escalated")
