"""ParticipantFixture: a participant's commands through the real kit, its own tables in SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Annotated

import pytest

from processor._authoring.handles import Setting
from processor._authoring.messages import Message, MessageMetadata, MessageRegistry, message_type
from processor._errors import ConfigurationError, RecordDataError, RuntimeFailure
from processor._invocation import command_message_id
from processor.participant import DROP, Replies, SkipDelivery, Sql, command_handler, participant
from processor.testing import DEFAULT_START_TIME, ParticipantFixture

REG = MessageRegistry()


@message_type("inv.ReserveStock", topic="inventory-commands", registry=REG)
class ReserveStock(Message):
    order_id: str
    sku: str
    quantity: int


@message_type("inv.ReleaseStock", topic="inventory-commands", registry=REG)
class ReleaseStock(Message):
    order_id: str


@message_type("inv.Recount", topic="inventory-commands", registry=REG)
class Recount(Message):
    sku: str


@message_type("inv.StockReserved", topic="inventory-events", registry=REG)
class StockReserved(Message):
    order_id: str
    left: int


@message_type("inv.StockRefused", topic="inventory-events", registry=REG)
class StockRefused(Message):
    order_id: str
    reason: str


@message_type("inv.StockReleased", topic="inventory-events", registry=REG)
class StockReleased(Message):
    order_id: str


SCHEMA = """
CREATE TABLE stock (sku text PRIMARY KEY, available int NOT NULL CHECK (available >= 0));
CREATE TABLE reservation (
    order_id text PRIMARY KEY,
    sku      text NOT NULL REFERENCES stock (sku),
    quantity int  NOT NULL
);
INSERT INTO stock VALUES ('sku-1', 5);
"""


class Audit:
    """A registered dependency: who saw which command."""

    def __init__(self) -> None:
        self.seen: list[str] = []


@participant(name="inventory")
class Inventory:
    def __init__(self) -> None:
        self.runs = 0
        self.bug = False
        self.skip = False

    @command_handler(expired=lambda c: StockRefused(order_id=c.order_id, reason="expired"))
    def reserve(
        self,
        command: ReserveStock,
        replies: Replies,
        sql: Sql,
        audit: Audit,
        limit: Annotated[int, Setting("inventory.max-quantity")],
    ) -> None:
        self.runs += 1
        audit.seen.append(command.order_id)
        if self.skip:
            raise SkipDelivery
        if command.quantity > limit:
            replies.send(StockRefused(order_id=command.order_id, reason="over the limit"))
            return
        sql.execute(
            "INSERT INTO reservation VALUES (%(order_id)s, %(sku)s, %(quantity)s) "
            "ON CONFLICT (order_id) DO UPDATE SET quantity = excluded.quantity",
            command.model_dump(),
        )
        # Fails the CHECK when short: the reservation above must go with it.
        left = sql.execute(
            "UPDATE stock SET available = available - %s WHERE sku = %s RETURNING available",
            (command.quantity, command.sku),
        ).fetchone()
        if self.bug:
            raise KeyError("a bug after the writes")
        assert left is not None
        replies.send(StockReserved(order_id=command.order_id, left=left[0]))

    @command_handler(expired=DROP)
    def release(
        self, command: ReleaseStock, replies: Replies, sql: Sql, meta: MessageMetadata
    ) -> None:
        self.runs += 1
        row = sql.execute(
            "DELETE FROM reservation WHERE order_id = %s RETURNING sku, quantity",
            (command.order_id,),
        ).fetchone()
        if row is not None:
            sql.execute(
                "UPDATE stock SET available = available + %s WHERE sku = %s", (row[1], row[0])
            )
        replies.send(StockReleased(order_id=command.order_id))


def _fixture(inventory: Inventory | None = None) -> ParticipantFixture:
    return ParticipantFixture(
        inventory or Inventory,
        settings={"inventory.max-quantity": 10},
        dependencies={Audit: Audit()},
        schema=SCHEMA,
        message_registry=REG,
    )


@pytest.fixture
def inventory() -> Inventory:
    return Inventory()


@pytest.fixture
def fixture(inventory: Inventory) -> Iterator[ParticipantFixture]:
    with _fixture(inventory) as fixture:
        yield fixture


def _available(fixture: ParticipantFixture) -> int:
    [(available,)] = fixture.sql("SELECT available FROM stock WHERE sku = %s", ("sku-1",))
    assert isinstance(available, int)
    return available


RESERVE = ReserveStock(order_id="o-1", sku="sku-1", quantity=2)


def test_first_delivery_runs_the_handler_and_its_writes_commit(
    fixture: ParticipantFixture, inventory: Inventory
) -> None:
    result = fixture.given_command(RESERVE, saga_type="order-saga", saga_id="o-1")

    result.expect_outcome("handled").expect_reply(StockReserved(order_id="o-1", left=3))
    assert inventory.runs == 1
    assert _available(fixture) == 3
    assert fixture.sql("SELECT * FROM reservation") == [("o-1", "sku-1", 2)]


def test_the_command_is_the_record_a_saga_sends(fixture: ParticipantFixture) -> None:
    result = fixture.given_command(
        RESERVE, saga_type="order-saga", saga_id="o-1", deadline=timedelta(minutes=5)
    )

    record = result.record
    headers = record.headers_text()
    assert (record.topic, record.key) == ("inventory-commands", b"o-1")
    assert headers == {
        "message-id": command_message_id("order-saga", "o-1", 1),
        "message-type": "inv.ReserveStock",
        "schema-version": "1",
        "correlation-id": "o-1",
        "causation-id": "fixture-1",
        "occurred-at": DEFAULT_START_TIME.isoformat(),
        "saga-type": "order-saga",
        "saga-id": "o-1",
        "deadline-unix-ms": str(int((DEFAULT_START_TIME.timestamp() + 300) * 1000)),
    }


def test_a_reply_carries_the_commands_saga_and_conversation(fixture: ParticipantFixture) -> None:
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    result = fixture.given_command(
        RESERVE,
        saga_type="order-saga",
        saga_id="o-1",
        message_id="cmd-1",
        headers={"correlation-id": "conversation-9", "traceparent": trace},
    )

    [reply] = result.replies
    assert (reply.topic, reply.key) == ("inventory-events", "o-1")
    assert reply.headers["correlation-id"] == "conversation-9"
    assert reply.headers["causation-id"] == "cmd-1"
    assert (reply.headers["saga-type"], reply.headers["saga-id"]) == ("order-saga", "o-1")
    assert reply.headers["traceparent"] == trace
    assert reply.headers["message-type"] == "inv.StockReserved"
    assert reply.message_id not in ("cmd-1", "")


def test_redelivery_returns_the_same_replies_without_running_the_handler(
    fixture: ParticipantFixture, inventory: Inventory
) -> None:
    first = fixture.given_command(RESERVE, saga_id="o-1")
    again = first.redeliver()

    again.expect_outcome("duplicate").expect_reply(StockReserved(order_id="o-1", left=3))
    assert [r.message_id for r in again.replies] == [r.message_id for r in first.replies]
    assert inventory.runs == 1
    assert _available(fixture) == 3


def test_the_same_command_id_at_a_new_offset_is_a_duplicate_too(
    fixture: ParticipantFixture, inventory: Inventory
) -> None:
    # The saga's relay may publish a command twice: same message id, a new record.
    first = fixture.given_command(RESERVE, saga_id="o-1")
    command_id = first.record.headers_text()["message-id"]
    again = fixture.given_command(RESERVE, saga_id="o-1", message_id=command_id)

    assert again.record.offset == first.record.offset + 1
    again.expect_outcome("duplicate")
    assert [r.message_id for r in again.replies] == [r.message_id for r in first.replies]
    assert inventory.runs == 1


def test_a_saga_retry_is_a_new_command(fixture: ParticipantFixture, inventory: Inventory) -> None:
    fixture.given_command(RESERVE, saga_id="o-1")
    # A new message id: the handler runs again; the business key keeps it harmless here.
    fixture.given_command(RESERVE, saga_id="o-1").expect_outcome("handled")
    assert inventory.runs == 2


def test_an_expired_deadline_yields_the_declared_reply_without_running_the_handler(
    fixture: ParticipantFixture, inventory: Inventory
) -> None:
    budget = DEFAULT_START_TIME + timedelta(minutes=1)
    fixture.when_time_elapses(timedelta(minutes=2))

    result = fixture.given_command(RESERVE, saga_id="o-1", deadline=budget)

    result.expect_outcome("expired").expect_reply(StockRefused(order_id="o-1", reason="expired"))
    assert inventory.runs == 0
    assert _available(fixture) == 5
    again = result.redeliver().expect_reply(StockRefused(order_id="o-1", reason="expired"))
    assert again.replies[0].message_id == result.replies[0].message_id


def test_a_deadline_still_ahead_lets_the_handler_run(fixture: ParticipantFixture) -> None:
    fixture.given_command(RESERVE, deadline=timedelta(seconds=30)).expect_outcome("handled")


def test_a_redelivery_after_the_deadline_gets_the_stored_reply(
    fixture: ParticipantFixture,
) -> None:
    first = fixture.given_command(RESERVE, saga_id="o-1", deadline=timedelta(seconds=30))
    fixture.when_time_elapses(timedelta(hours=1))

    again = first.redeliver()

    again.expect_outcome("duplicate").expect_reply(StockReserved(order_id="o-1", left=3))


def test_an_expired_command_declared_drop_gets_no_reply(
    fixture: ParticipantFixture, inventory: Inventory
) -> None:
    result = fixture.given_command(
        ReleaseStock(order_id="o-1"), deadline=DEFAULT_START_TIME - timedelta(seconds=1)
    )

    result.expect_outcome("dropped").expect_no_reply()
    result.redeliver().expect_outcome("duplicate").expect_no_reply()
    assert inventory.runs == 0


def test_a_handler_that_raises_is_dead_lettered_and_rolled_back(
    fixture: ParticipantFixture, inventory: Inventory
) -> None:
    inventory.bug = True

    result = fixture.given_command(RESERVE, saga_id="o-1")

    result.expect_outcome("dead-lettered").expect_no_reply()
    result.expect_dead_lettered(reason_contains="handler-failed")
    result.expect_dead_lettered(reason_contains="KeyError")
    assert fixture.sql("SELECT * FROM reservation") == []
    assert _available(fixture) == 5
    [letter] = result.dead_letters
    assert letter.headers["source-topic"] == "inventory-commands"
    # Recorded in the inbox: a redelivery is not dead-lettered twice.
    again = result.redeliver()
    again.expect_outcome("duplicate").expect_no_reply()
    assert again.dead_letters == []


def test_a_statement_the_database_refuses_rolls_back_the_handlers_writes(
    fixture: ParticipantFixture,
) -> None:
    short = ReserveStock(order_id="o-2", sku="sku-1", quantity=9)

    result = fixture.given_command(short, saga_id="o-2")

    result.expect_dead_lettered(reason_contains="refused-by-database")
    result.expect_dead_lettered(reason_contains="CHECK constraint failed")
    assert fixture.sql("SELECT * FROM reservation") == []
    assert _available(fixture) == 5


def test_skip_delivery_passes_the_command_over_unrecorded(
    fixture: ParticipantFixture, inventory: Inventory
) -> None:
    inventory.skip = True
    skipped = fixture.given_command(RESERVE, saga_id="o-1")
    skipped.expect_outcome("skipped").expect_no_reply()
    assert fixture.store.memory.tables.inbox == {}

    inventory.skip = False
    skipped.redeliver().expect_outcome("handled").expect_reply(
        StockReserved(order_id="o-1", left=3)
    )
    assert inventory.runs == 2


def test_settings_dependencies_and_metadata_reach_the_handlers(
    fixture: ParticipantFixture,
) -> None:
    fixture.given_command(
        ReserveStock(order_id="o-3", sku="sku-1", quantity=11), saga_id="o-3"
    ).expect_reply(StockRefused(order_id="o-3", reason="over the limit"))
    fixture.given_command(RESERVE, saga_id="o-1")
    fixture.given_command(ReleaseStock(order_id="o-1"), saga_id="o-1").expect_reply(
        StockReleased(order_id="o-1")
    )
    assert _available(fixture) == 5


def test_missing_settings_fail_like_the_service_at_startup() -> None:
    with pytest.raises(ConfigurationError, match=r"inventory\.max-quantity"):
        ParticipantFixture(Inventory, dependencies={Audit: Audit()}, message_registry=REG)


def test_a_malformed_header_is_dead_lettered(fixture: ParticipantFixture) -> None:
    fixture.given_command(RESERVE, headers={"deadline-unix-ms": "soon"}).expect_dead_lettered(
        reason_contains="invalid-header"
    )


def test_a_command_the_participant_does_not_handle_is_refused(
    fixture: ParticipantFixture,
) -> None:
    with pytest.raises(AssertionError, match="no handler for Recount"):
        fixture.given_command(Recount(sku="sku-1"))


def test_a_mismatch_shows_a_diff_and_the_outcome(
    fixture: ParticipantFixture, inventory: Inventory
) -> None:
    result = fixture.given_command(RESERVE, saga_id="o-1")
    with pytest.raises(AssertionError, match=r"replies differ \(outcome: handled\)") as info:
        result.expect_reply(StockReserved(order_id="o-1", left=4))
    assert "-[StockReserved(order_id='o-1', left=4)]" in str(info.value)
    with pytest.raises(AssertionError, match="expected no reply"):
        result.expect_no_reply()
    with pytest.raises(AssertionError, match="expected the command to be dead-lettered"):
        result.expect_dead_lettered()

    inventory.bug = True
    failed = fixture.given_command(RESERVE, saga_id="o-1")
    with pytest.raises(AssertionError, match="handler-failed: KeyError"):
        failed.expect_reply(StockReserved(order_id="o-1", left=1))
    with pytest.raises(AssertionError, match="no dead letter mentions 'ValueError'"):
        failed.expect_dead_lettered(reason_contains="ValueError")


# -- the SQL handle -------------------------------------------------------------------------


def test_placeholders_follow_psycopg(fixture: ParticipantFixture) -> None:
    assert fixture.sql("SELECT sku FROM stock WHERE sku LIKE %s", ("sku%",)) == [("sku-1",)]
    assert fixture.sql("SELECT %(a)s, %(a)s || %(b)s", {"a": "x", "b": "y"}) == [("x", "xy")]
    assert fixture.sql("SELECT 'a%%b'") == [("a%b",)]
    assert fixture.sql("SELECT %s", (Decimal("12.50"),)) == [("12.50",)]
    with pytest.raises(RuntimeFailure, match="mixed"):
        fixture.sql("SELECT %s, %(a)s", ("x",))
    with pytest.raises(RuntimeFailure, match="placeholders"):
        fixture.sql("SELECT 'a%'")


def test_rowcount_counts_returned_and_changed_rows(fixture: ParticipantFixture) -> None:
    with fixture.transaction() as sql:
        assert sql.execute("SELECT * FROM stock").rowcount == 1
        assert sql.execute("UPDATE stock SET available = 4").rowcount == 1
        assert sql.execute("UPDATE stock SET available = 4 WHERE sku = 'x'").rowcount == 0


def test_a_transaction_after_a_failed_statement_cannot_commit(
    fixture: ParticipantFixture,
) -> None:
    def go_on_after_a_refusal() -> None:
        with fixture.transaction() as sql:
            sql.execute("UPDATE stock SET available = 1")
            with pytest.raises(RecordDataError):
                sql.execute("UPDATE stock SET available = -1")
            with pytest.raises(RuntimeFailure, match="aborted"):
                sql.execute("SELECT 1")

    with pytest.raises(RuntimeFailure, match="25P02"):
        go_on_after_a_refusal()
    assert _available(fixture) == 5


def test_a_savepoint_recovers_from_a_failed_statement(fixture: ParticipantFixture) -> None:
    with fixture.transaction() as sql:
        sql.execute("UPDATE stock SET available = 1")
        sql.execute("SAVEPOINT try")
        with pytest.raises(RecordDataError):
            sql.execute("UPDATE stock SET available = -1")
        sql.execute("ROLLBACK TO SAVEPOINT try")
    assert _available(fixture) == 1


def test_a_handler_may_not_end_the_transaction(fixture: ParticipantFixture) -> None:
    with pytest.raises(RuntimeFailure, match="COMMIT"), fixture.transaction() as sql:
        sql.execute("COMMIT")


def test_a_postgres_only_statement_fails_as_fatal(fixture: ParticipantFixture) -> None:
    with pytest.raises(RuntimeFailure, match="database error") as info:
        fixture.sql("SELECT available::text FROM stock FOR UPDATE")
    assert not isinstance(info.value, RecordDataError)


def test_a_schema_sqlite_refuses_is_reported() -> None:
    with pytest.raises(ValueError, match="SQLite refused the schema"):
        ParticipantFixture(
            Inventory,
            settings={"inventory.max-quantity": 1},
            dependencies={Audit: Audit()},
            schema="CREATE TABLE t (id serial PRIMARY KEY, v jsonb); CREATE INDEX ON t (v);",
            message_registry=REG,
        )


def test_the_virtual_clock_only_moves_forward(fixture: ParticipantFixture) -> None:
    assert fixture.when_time_elapses(timedelta(minutes=3)).now == DEFAULT_START_TIME + timedelta(
        minutes=3
    )
    with pytest.raises(ValueError, match="forward"):
        fixture.when_time_elapses(timedelta(seconds=-1))


# -- the demo's order participants, with their own schema -------------------------------------


def test_the_demo_inventory_reserves_releases_and_refuses_late_commands(
    request: pytest.FixtureRequest,
) -> None:
    from demo.orders import DDL, EXPIRED, Inventory
    from schemas.orders import (
        ReleaseStock,
        ReserveStock,
        StockReleased,
        StockReservationFailed,
        StockReserved,
        StockUnavailable,
    )

    fixture = ParticipantFixture(Inventory, schema=DDL)
    request.addfinalizer(fixture.close)
    fixture.sql("INSERT INTO stock VALUES (%s, %s)", ("sku-1", 2))
    facts = {"customer_id": "c-1", "sku": "sku-1", "quantity": 2, "amount": Decimal("25.00")}

    reserved = fixture.given_command(
        ReserveStock(order_id="o-1", **facts), saga_type="order-saga", saga_id="o-1"
    ).expect_reply(StockReserved(order_id="o-1"))
    reserved.redeliver().expect_outcome("duplicate").expect_reply(StockReserved(order_id="o-1"))
    fixture.given_command(ReserveStock(order_id="o-2", **facts), saga_id="o-2").expect_reply(
        StockUnavailable(order_id="o-2", reason="not enough stock")
    )
    assert fixture.sql("SELECT available FROM stock") == [(0,)]

    fixture.given_command(ReleaseStock(order_id="o-1", **facts), saga_id="o-1").expect_reply(
        StockReleased(order_id="o-1")
    )
    assert fixture.sql("SELECT available FROM stock") == [(2,)]
    assert fixture.sql("SELECT released FROM reservation WHERE order_id = 'o-1'") == [(1,)]

    fixture.given_command(
        ReserveStock(order_id="o-3", **facts),
        saga_id="o-3",
        deadline=fixture.now - timedelta(milliseconds=1),
    ).expect_reply(StockReservationFailed(order_id="o-3", reason=EXPIRED))
    assert fixture.sql("SELECT available FROM stock") == [(2,)]


def test_the_demo_payments_move_money_once(request: pytest.FixtureRequest) -> None:
    from demo.orders import DDL, MERCHANT, Payments
    from schemas.orders import CapturePayment, PaymentCaptured, PaymentRefunded, RefundPayment

    fixture = ParticipantFixture(Payments, schema=DDL)
    request.addfinalizer(fixture.close)
    with fixture.transaction() as sql:
        for owner, balance in (("c-1", Decimal("50.00")), (MERCHANT, Decimal(0))):
            sql.execute("INSERT INTO wallet VALUES (%s, %s)", (owner, balance))
    facts = {"customer_id": "c-1", "sku": "sku-1", "quantity": 1, "amount": Decimal("25.00")}

    captured = fixture.given_command(CapturePayment(order_id="o-1", **facts), saga_id="o-1")
    captured.expect_reply(PaymentCaptured(order_id="o-1"))
    captured.redeliver().expect_reply(PaymentCaptured(order_id="o-1"))
    # A saga's retry (a new command id) is answered like the first attempt, charging nothing.
    fixture.given_command(CapturePayment(order_id="o-1", **facts), saga_id="o-1").expect_reply(
        PaymentCaptured(order_id="o-1")
    )
    balances = dict(fixture.sql("SELECT owner, balance FROM wallet"))
    assert balances == {"c-1": Decimal("25.00"), MERCHANT: Decimal("25.00")}

    fixture.given_command(RefundPayment(order_id="o-1", **facts), saga_id="o-1").expect_reply(
        PaymentRefunded(order_id="o-1")
    )
    balances = dict(fixture.sql("SELECT owner, balance FROM wallet"))
    assert balances == {"c-1": Decimal("50.00"), MERCHANT: 0}
