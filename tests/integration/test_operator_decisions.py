"""`saga resolve`, `saga terminate` and `saga cancel` from the CLI, on real Kafka and PostgreSQL.

The order saga's shipping step fails twice (its retry schedule comes from a setting) and is
escalated to a person; `saga resolve ... skip` completes it. Its refund fails past its undo
retries and waits on a person; `saga resolve ... compensate` is refused there, and `skip` goes on
with the stock release. `saga terminate` is refused without
`--force` and ends an order without compensation with it; `saga cancel` of the transfer saga
before its debit is confirmed reverses the debit. Each command waits for the processor's
outcome and says it in its exit code.
"""

from __future__ import annotations

import json
import shlex
import uuid
from datetime import timedelta
from decimal import Decimal
from functools import partial
from typing import Any

import pytest

from processor import (
    DecisionRequest,
    SagaCommands,
    SagaDeadlines,
    SagaLifecycle,
    SagaOutcome,
    SagaState,
    saga,
    saga_deadline_handler,
    saga_decision_handler,
    saga_event_handler,
)
from processor._cli import main
from processor.settings import ProcessorSettings
from sagas.transfer import TransferSaga
from schemas.orders import (
    EscalateToPerson,
    FraudReviewApproved,
    FraudReviewRejected,
    OrderPlaced,
    PaymentCaptured,
    RefundFailed,
    ShipmentFailed,
    StockReleased,
    StockReserved,
)
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC, TransferRequested
from tests.integration.test_observe import _metrics
from tests.integration.test_operator_trail import wait_until_state
from tests.support.harness import (
    Publisher,
    Reader,
    create_topics,
    query,
    running,
    settings_for,
    wait_until,
)
from tests.support.orders import SAGA_TYPE, Orders, make_orders
from tests.support.procs import settings_env

pytestmark = pytest.mark.integration

OPERATOR_KEY = "decisions-operator-key"


@pytest.fixture
def orders(kafka_bootstrap: str, database_url: str, pg_schema: str) -> Orders:
    return make_orders(kafka_bootstrap, database_url, pg_schema)


def _cli(settings: ProcessorSettings, mp: pytest.MonkeyPatch, line: str) -> int:
    """Runs ``saga-processor LINE`` as a user would, with the processor's settings."""
    for name, value in settings_env(settings).items():
        mp.setenv(name, value)
    return main(shlex.split(line))


def _escalate_shipping(o: Orders, order: str) -> None:
    o.place(order)
    for version, reply in enumerate((StockReserved, PaymentCaptured, FraudReviewApproved), 2):
        o.send(reply(order_id=order), order)
        o.wait_version(order, version)
    o.send(ShipmentFailed(order_id=order, reason="carrier down"), order)
    # The failure (5) and the retry 0.2 s later (6): the second attempt is out.
    o.wait_version(order, 6)
    o.send(ShipmentFailed(order_id=order, reason="carrier down"), order)
    o.wait_version(order, 7)
    wait_until_state(o, order, "WAITING")


def test_an_escalated_step_is_resolved_and_terminate_needs_force(
    orders: Orders,
    kafka_bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    o = orders
    escalated, other = (f"o-{uuid.uuid4().hex[:8]}" for _ in range(2))

    def cli(line: str) -> int:
        return _cli(o.settings, monkeypatch, line)

    escalations = Reader(kafka_bootstrap, [o.settings.topic_prefix + "escalations"])
    try:
        with running(o.settings):
            _escalate_shipping(o, escalated)
            escalations.wait_for(lambda rs: len(rs) >= 1, what="the escalation")
            # The reminder is a day away; an operator makes it due now (and waits until applied).
            remind = f"deadlines fire-now {SAGA_TYPE} {escalated} machine.step --reason 'remind'"
            assert cli(remind) == 0
            escalations.wait_for(lambda rs: len(rs) >= 2, what="the reminder")
            o.place(other)
            # Nothing waits for a decision on the other order: refused, exit code 1.
            assert cli(f"saga resolve {SAGA_TYPE} {other} skip --reason mistake") == 1
            assert cli(f"saga resolve {SAGA_TYPE} {escalated} skip --reason 'shipped by hand'") == 0
            o.wait_status(escalated, "ended")
            assert o.row(escalated)[:2] == ("ended", "COMPLETED")  # type: ignore[index]

            # Without --force nothing is sent at all.
            assert cli(f"saga terminate {SAGA_TYPE} {other} --reason 'test order'") == 2
            assert o.row(other)[0] == "active"  # type: ignore[index]
            assert cli(f"saga terminate {SAGA_TYPE} {other} --reason 'test order' --force") == 0
            o.wait_status(other, "ended")
        # Outcomes by saga type, as a script reads them.
        capsys.readouterr()
        assert cli(f"states --saga-type {SAGA_TYPE} --json") == 0
        counts = {
            s["machine_state"]: s["count"] for s in json.loads(capsys.readouterr().out)["states"]
        }
        assert counts == {"COMPLETED": 1, "TERMINATED": 1}
        # Each decided request is in the audit trail, with who asked and why, newest first;
        # `show` lists a saga's own, oldest first.
        assert cli(f"audit list --saga-type {SAGA_TYPE} --saga-id {other} --json") == 0
        audited = json.loads(capsys.readouterr().out)
        assert [(a["action"], a["outcome"], a["reason"]) for a in audited] == [
            ("terminate", "applied", "test order"),
            ("resolve", "operator-refused", "mistake"),
        ]
        assert all(a["actor"] for a in audited)
        assert cli(f"show {SAGA_TYPE} {other} --json") == 0
        shown = json.loads(capsys.readouterr().out)["audit"]
        assert [a["id"] for a in shown] == [a["id"] for a in reversed(audited)]
        told = [EscalateToPerson.model_validate_json(e.value() or b"") for e in escalations.records]
        assert [(t.reason, t.step, t.machine_state) for t in told] == [
            ("retries-exhausted", "ship", "WAITING"),
            ("still-waiting", "ship", "WAITING"),
        ]
        trail = o.db(
            "SELECT message_type, outcome, detail FROM saga_history "
            "WHERE saga_id IN (%s, %s) AND kind = 'operator' ORDER BY id",
            escalated,
            other,
        )
        assert [(t, r) for t, r, _ in trail] == [
            ("operator:deadline-fire-now", "applied"),
            ("operator:resolve", "operator-refused"),
            ("operator:resolve", "applied"),
            ("operator:terminate", "applied"),
        ]
        assert "no compensation ran" in trail[3][2]
        # Terminated as it stood (its reservation was never undone), and shown as such.
        assert o.row(other)[1] == "TERMINATED"  # type: ignore[index]
        [(state,)] = o.db("SELECT state FROM saga_instance WHERE saga_id = %s", other)
        assert state["machine"]["state"] == "RUNNING"
    finally:
        escalations.close()


def test_an_escalated_undo_is_resolved_from_the_cli(
    orders: Orders, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refund fails past its undo retries: the saga waits; `compensate` is refused, `skip`
    (refunded by hand) goes on with the stock release, and the saga ends COMPENSATED."""
    o, order = orders, f"o-{uuid.uuid4().hex[:8]}"

    def cli(line: str) -> int:
        return _cli(o.settings, monkeypatch, line)

    def progress() -> dict[str, Any]:
        [(state,)] = o.db("SELECT state FROM saga_instance WHERE saga_id = %s", order)
        return dict(state["progress"])

    def attempted(n: int) -> bool:
        return int(progress()["attempt"]) >= n

    escalations = Reader(kafka_bootstrap, [o.settings.topic_prefix + "escalations"])
    try:
        with running(o.settings):
            o.place(order)
            for version, reply in enumerate((StockReserved, PaymentCaptured), 2):
                o.send(reply(order_id=order), order)
                o.wait_version(order, version)
            o.send(FraudReviewRejected(order_id=order, reason="stolen card"), order)
            wait_until_state(o, order, "COMPENSATING")
            # Five refund attempts fail; each backoff (seconds to minutes) is made due now.
            for attempt in range(1, 6):
                wait_until(partial(attempted, attempt), what=f"refund attempt {attempt}")
                version = o.row(order)[2]  # type: ignore[index]
                o.send(RefundFailed(order_id=order, reason="provider down"), order)
                o.wait_version(order, version + 1)  # the failure applied: a backoff is armed
                if attempt < 5:
                    retry = f"deadlines fire-now {SAGA_TYPE} {order} machine.step --reason now"
                    assert cli(retry) == 0
            wait_until_state(o, order, "WAITING")
            assert progress()["undo_escalated"] == "pay"
            [(waiting,)] = o.db("SELECT parked_reason FROM saga_instance WHERE saga_id = %s", order)
            assert "undo of pay failed: provider down" in waiting
            refused = f"saga resolve {SAGA_TYPE} {order} compensate --reason 'undo it'"
            assert cli(refused) == 1
            assert cli(f"saga resolve {SAGA_TYPE} {order} skip --reason 'refunded by hand'") == 0
            wait_until_state(o, order, "COMPENSATING")
            o.send(StockReleased(order_id=order), order)
            o.wait_status(order, "ended")
        assert o.row(order)[:2] == ("ended", "COMPENSATED")  # type: ignore[index]
        [(state,)] = o.db("SELECT state FROM saga_instance WHERE saga_id = %s", order)
        assert state["progress"]["undone"] == ["pay", "reserve"]
        assert state["progress"]["undone_by_hand"] == ["pay"]
        trail = o.db(
            "SELECT outcome, detail FROM saga_history "
            "WHERE saga_id = %s AND message_type = 'operator:resolve' ORDER BY id",
            order,
        )
        assert [t for t, _ in trail] == ["operator-refused", "applied"]
        assert "already compensating" in trail[0][1]
        escalations.wait_for(lambda rs: len(rs) >= 1, what="the escalation")
        told = [EscalateToPerson.model_validate_json(e.value() or b"") for e in escalations.records]
        assert [(t.reason, t.step, t.machine_state) for t in told] == [
            ("compensation-failed", "pay", "WAITING")
        ]
    finally:
        escalations.close()


def test_cancel_before_the_debit_is_confirmed_reverses_it(
    kafka_bootstrap: str, database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    create_topics(
        kafka_bootstrap,
        [prefix + t for t in (TRANSFER_EVENTS_TOPIC, ACCOUNT_COMMANDS_TOPIC, "saga-dead-letters")],
    )
    settings = settings_for(
        kafka_bootstrap,
        database_url,
        pg_schema,
        prefix,
        operator={"key": OPERATOR_KEY, "name": "test-operator"},
    )
    commands = Reader(kafka_bootstrap, [prefix + ACCOUNT_COMMANDS_TOPIC])
    pub = Publisher(kafka_bootstrap)
    tid = f"tr-{uuid.uuid4().hex[:6]}"

    def cli(line: str) -> int:
        return _cli(settings, monkeypatch, line)

    try:
        with running(settings, [TransferSaga]):
            pub.event(
                prefix + TRANSFER_EVENTS_TOPIC,
                tid,
                TransferRequested(
                    transfer_id=tid,
                    source_account_id="A",
                    target_account_id="B",
                    amount=Decimal("10.00"),
                ),
            )
            pub.flush()
            commands.wait_for(lambda rs: len(rs) >= 1, what="DebitAccount")
            assert cli(f"saga cancel transfer-saga {tid} --reason 'customer called'") == 0
            commands.wait_for(lambda rs: len(rs) >= 2, what="ReverseDebit")
            wait_until(
                lambda: (
                    query(database_url, pg_schema, "SELECT status FROM saga_instance")
                    == [("ended",)]
                ),
                what="transfer ended",
            )
        types = [commands.headers(m)["message-type"] for m in commands.records]
        assert types == ["transfers.DebitAccount", "transfers.ReverseDebit"]
    finally:
        commands.close()


@saga(type="escalating-parcel")
class EscalatingParcel(SagaState):
    """Asks a person as soon as shipping fails; a decision ships again or gives up."""

    order_id: str = ""

    @saga_event_handler(OrderPlaced, association_property="order_id", start=True)
    def on_placed(self, event: OrderPlaced) -> None:
        self.order_id = event.order_id

    @saga_event_handler(ShipmentFailed, association_property="order_id")
    def on_failed(
        self,
        event: ShipmentFailed,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
    ) -> None:
        deadlines.schedule("remind", timedelta(days=1))
        commands.send(
            EscalateToPerson(
                order_id=self.order_id,
                reason="shipping-failed",
                step="ship",
                machine_state="WAITING",
                detail="the carrier refused the parcel",
            )
        )
        lifecycle.escalate("the carrier refused the parcel")

    @saga_deadline_handler("remind")
    def on_remind(self, lifecycle: SagaLifecycle) -> None:
        lifecycle.escalate("the carrier refused the parcel, a day ago")

    @saga_decision_handler()
    def on_decision(
        self, request: DecisionRequest, commands: SagaCommands, lifecycle: SagaLifecycle
    ) -> None:
        if request.decision != "retry":
            lifecycle.end(SagaOutcome.FAILED)


def test_a_plain_saga_waits_on_a_person_until_an_operator_decides(
    orders: Orders, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    o = orders
    parcel = f"p-{uuid.uuid4().hex[:8]}"

    def cli(line: str) -> int:
        return _cli(o.settings, monkeypatch, line)

    def row() -> tuple[Any, ...] | None:
        rows = o.db(
            "SELECT status, machine_state, parked_reason FROM saga_instance WHERE saga_id = %s",
            parcel,
        )
        return rows[0] if rows else None

    with running(o.settings, [EscalatingParcel]) as proc:
        o.send(
            OrderPlaced(
                order_id=parcel, customer_id="c", sku="mug", quantity=1, amount=Decimal("1")
            ),
            parcel,
        )
        o.send(ShipmentFailed(order_id=parcel, reason="refused"), parcel)
        wait_until(lambda: row() is not None and row()[1] == "WAITING", what="waiting")  # type: ignore[index]
        assert row() == ("active", "WAITING", "waiting on a person: the carrier refused the parcel")
        # The metrics see it too: one parcel waiting, for less than a minute so far.
        young = (("le", "60"), ("saga_type", "escalating-parcel"), ("state", "WAITING"))
        port = proc.metrics_port
        assert port is not None
        wait_until(
            lambda: _metrics(port).get(("saga_state_age_seconds_bucket", young)) == 1,
            what="the waiting parcel in the state age histogram",
        )
        capsys.readouterr()
        assert cli("sagas stuck --older-than 0s --json") == 0
        stuck = json.loads(capsys.readouterr().out)
        assert [(s["saga_id"], s["machine_state"]) for s in stuck] == [(parcel, "WAITING")]
        # Not parked (its events still flow), but `parked` lists it beside the parked ones.
        assert cli("parked") == 0
        listing = capsys.readouterr().out.splitlines()
        assert listing[0].startswith("waiting on a person")
        [line] = [ln for ln in listing if parcel in ln]
        assert line.split()[0] == "escalating-parcel"
        assert line.endswith("the carrier refused the parcel")
        # An operator's action that runs no handler leaves it with the person (it cleared the
        # label: the row was written as if nothing waited).
        cancel = f"deadlines cancel escalating-parcel {parcel} remind --reason 'no reminders'"
        assert cli(cancel) == 0
        assert o.db("SELECT count(*) FROM saga_deadline WHERE saga_id = %s", parcel) == [(0,)]
        assert row() == ("active", "WAITING", "waiting on a person: the carrier refused the parcel")
        assert cli(f"saga resolve escalating-parcel {parcel} give-up --reason 'lost'") == 0
        wait_until(lambda: row() is not None and row()[0] == "ended", what="ended")  # type: ignore[index]
    assert row() == ("ended", "FAILED", None)
