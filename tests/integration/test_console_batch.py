"""The sagas list's batch form over real HTTP: an admin previews, confirms the count, and sends.

Three orders are in flight, a fourth has ended. An operator sees no batch form and is refused
(403); an admin's first POST shows the count and the sagas (a dry run: nothing is sent), a wrong
count or a terminate without its box ticked sends nothing, and the count typed back sends one
batch: each order in flight is terminated once, the ended one is left alone, and the audit page
shows the batch's entries.
"""

from __future__ import annotations

import re
import uuid
from urllib.parse import parse_qs, urlsplit

import pytest

from sagas.order import OrderSaga
from tests.integration.test_console import _db, world  # noqa: F401 - the fixture
from tests.integration.test_console_security import ADA, OLGA, _console
from tests.support.console import FormClient
from tests.support.harness import running, wait_until
from tests.support.orders import Orders

pytestmark = [pytest.mark.integration]


def test_an_admin_previews_then_confirms_a_batch_and_an_operator_is_refused(
    world: Orders,  # noqa: F811 - the fixture above
) -> None:
    o = world
    run = uuid.uuid4().hex[:6]
    orders = [f"ord-{run}-{n}" for n in range(3)]
    ended = f"ord-{run}-ended"
    form = {"action": "terminate", "reason": "test orders", "type": "order-saga"}
    with running(o.settings, [OrderSaga]), _console(o) as base:
        for order in [*orders, ended]:
            o.place(order)
        # Ended by hand (the status alone): a batch leaves an ended saga alone, whatever else.
        ended_sql = "UPDATE saga_instance SET status = 'ended' WHERE saga_id = %s RETURNING 1"
        assert _db(o, ended_sql, ended) == [(1,)]

        with FormClient(base) as olga:
            assert olga.sign_in(*OLGA).status_code == 303
            assert 'id="form-batch"' not in olga.http.get("/sagas?type=order-saga").text
            refused = olga.post("/sagas/batch", form)
            assert refused.status_code == 403
            assert refused.text == "batch needs the admin role (olga)"

        with FormClient(base) as ada:
            assert ada.sign_in(*ADA).status_code == 303
            listing = ada.http.get("/sagas?type=order-saga").text
            assert 'id="form-batch"' in listing
            assert '<input type="hidden" name="type" value="order-saga">' in listing

            preview = ada.post("/sagas/batch", form)
            assert preview.status_code == 200
            assert '<b id="batch-matched">3</b>' in preview.text
            assert sorted(re.findall(r'class="saga-link"[^>]*>([^<]+)<', preview.text)) == orders
            assert 'name="confirm"' in preview.text
            assert _db(o, "SELECT count(*) FROM operator_audit") == [(0,)]

            wrong = ada.post("/sagas/batch", {**form, "confirm": "4", "force": "yes"})
            assert wrong.status_code == 409
            assert "3 sagas match now, not the count confirmed: nothing sent" in wrong.text
            unforced = ada.post("/sagas/batch", {**form, "confirm": "3"})
            assert unforced.status_code == 400
            assert "tick the box" in unforced.text
            assert _db(o, "SELECT count(*) FROM operator_audit") == [(0,)]

            sent = ada.post(
                "/sagas/batch", {**form, "confirm": "3", "force": "yes"}, follow_redirects=False
            )
            assert sent.status_code == 303
            query = parse_qs(urlsplit(sent.headers["location"]).query)
            [batch] = query["batch"]
            assert query["notice"] == [f"batch {batch}: terminate sent to 3 of 3 sagas"]

            done = "SELECT count(*) FROM saga_instance WHERE machine_state = 'TERMINATED'"
            wait_until(lambda: _db(o, done) == [(3,)], 30, "the orders terminated")
            entries = "SELECT count(*) FROM operator_audit WHERE target->>'batch' = %s"
            wait_until(lambda: _db(o, entries, batch) == [(4,)], 30, "the batch's entries")
            page = ada.http.get(sent.headers["location"]).text
            assert f"Batch <code>{batch}</code>" in page
            assert page.count('class="audit-row"') == 4
            assert "batch-terminate" in page

        trail = "SELECT saga_id, actor, outcome FROM operator_audit WHERE action = 'terminate'"
        assert sorted(_db(o, trail)) == [(order, "ada", "applied") for order in orders]
        assert o.row(ended) == ("ended", "RUNNING", 1)
