"""`saga reset` through the saga fixture: rebuild quietly, replay live, refuse resends.

A transfer whose debit-confirmed handler forgot to send the credit (the bug) is fixed, then
reset before the confirmation: the credit goes out once, the debit is not sent again. Going back
before the start would send the debit again: refused unless the operator says so.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from processor import (
    SagaCommands,
    SagaDeadlines,
    SagaLifecycle,
    SagaOutcome,
    SagaState,
    saga,
    saga_deadline_handler,
    saga_event_handler,
)
from processor._engine.reset import effective
from processor._engine.rows import Outcome, PastInput
from processor.testing import SagaFixture
from schemas.transfers import (
    CreditAccount,
    DebitAccount,
    DebitConfirmed,
    ReverseDebit,
    TransferRequested,
)

FIXED = {"credit": False}
TIMEOUT = "reset-timeout"


@saga(type="reset-transfer")
class Transfer(SagaState):
    transfer_id: str = ""
    amount: Decimal = Decimal(0)
    debited: bool = False

    @saga_event_handler(TransferRequested, association_property="transfer_id", start=True)
    def on_requested(
        self, event: TransferRequested, commands: SagaCommands, deadlines: SagaDeadlines
    ) -> None:
        self.transfer_id, self.amount = event.transfer_id, event.amount
        debit = DebitAccount(transfer_id=self.transfer_id, account_id="a", amount=event.amount)
        commands.send(debit)
        deadlines.schedule(TIMEOUT, timedelta(minutes=30))

    @saga_event_handler(DebitConfirmed, association_property="transfer_id")
    def on_debited(
        self, event: DebitConfirmed, commands: SagaCommands, deadlines: SagaDeadlines
    ) -> None:
        self.debited = True
        if FIXED["credit"]:  # the bug: before the fix, no credit and the timeout stays
            commands.send(
                CreditAccount(transfer_id=self.transfer_id, account_id="b", amount=self.amount)
            )
            deadlines.cancel(TIMEOUT)

    @saga_deadline_handler(TIMEOUT)
    def on_timeout(self, commands: SagaCommands, lifecycle: SagaLifecycle) -> None:
        reverse = ReverseDebit(transfer_id=self.transfer_id, account_id="a", amount=self.amount)
        commands.send(reverse)
        lifecycle.end(SagaOutcome.TIMED_OUT)


AMOUNT = Decimal("10.00")
REQUESTED = TransferRequested(
    transfer_id="t-1", source_account_id="a", target_account_id="b", amount=AMOUNT
)
CONFIRMED = DebitConfirmed(transfer_id="t-1", account_id="a", amount=AMOUNT)
CREDIT = CreditAccount(transfer_id="t-1", account_id="b", amount=AMOUNT)
DEBIT = DebitAccount(transfer_id="t-1", account_id="a", amount=AMOUNT)


@pytest.fixture
def buggy() -> SagaFixture:
    FIXED["credit"] = False
    fixture = SagaFixture(Transfer)
    fixture.given(REQUESTED)
    fixture.when(CONFIRMED).expect_no_commands()
    return fixture


def test_a_reset_after_the_fix_sends_what_the_fixed_handler_sends_and_nothing_again(
    buggy: SagaFixture,
) -> None:
    FIXED["credit"] = True
    result = buggy.when_reset(CONFIRMED, reason="credit handler fixed")
    result.expect_commands(CREDIT).expect_no_deadline(TIMEOUT).expect_state(debited=True)
    rows = [h for h in _history(buggy) if h.message_type == "operator:reset"]
    assert [h.outcome for h in rows] == [Outcome.APPLIED]
    assert rows[0].effects == {"reset": {"before": "fixture-2", "rebuilt": 1, "replayed": 1}}
    replayed = [h for h in _history(buggy) if h.outcome is Outcome.REPLAYED]
    assert [h.message_id for h in replayed] == ["fixture-2"]
    # The saga runs on from the reset: nothing fires later.
    buggy.when_time_elapses(timedelta(hours=1)).expect_no_commands()


def test_going_back_before_a_sent_command_is_refused_unless_the_operator_says_so(
    buggy: SagaFixture,
) -> None:
    FIXED["credit"] = True
    with pytest.raises(AssertionError, match=r"send again 1 transfers\.DebitAccount.*--resend"):
        buggy.when_reset(REQUESTED)
    # Refused changes nothing: the saga still waits for its timeout.
    assert TIMEOUT in buggy._pending_of(buggy.saga_id)
    buggy.when_reset(REQUESTED, resend=True).expect_commands(DEBIT, CREDIT)


def test_a_reset_reopens_an_ended_saga_and_replays_a_fired_deadline_only_if_still_due(
    buggy: SagaFixture,
) -> None:
    buggy.when_time_elapses(timedelta(minutes=31)).expect_commands(
        ReverseDebit(transfer_id="t-1", account_id="a", amount=AMOUNT)
    ).expect_ended()
    # Unfixed, the replay fires the timeout again: that would reverse the debit twice.
    with pytest.raises(AssertionError, match=r"send again 1 transfers\.ReverseDebit"):
        buggy.when_reset(CONFIRMED)
    FIXED["credit"] = True
    # Fixed, the confirmation cancels the timeout, so its fired record replays as stale.
    result = buggy.when_reset(CONFIRMED)
    result.expect_commands(CREDIT).expect_active()
    stale = [h for h in _history(buggy) if h.outcome is Outcome.DEADLINE_STALE]
    assert len(stale) == 1


def test_a_reset_names_what_it_cannot_do(buggy: SagaFixture) -> None:
    with pytest.raises(AssertionError, match="no input the saga stands on"):
        buggy.when_reset("no-such-message")


def test_an_earlier_reset_cuts_the_inputs_it_replaced() -> None:
    def past(mid: str, mtype: str = "e", outcome: str = "applied", **effects: object) -> PastInput:
        return PastInput(mid, mtype, "event", outcome, 1, "t", 0, 0, {}, b"", effects or None)

    reset = past("r", "operator:reset", reset={"before": "b", "replayed": 2})
    history = [
        past("a"),
        past("b"),
        past("c"),
        reset,
        past("b", outcome="replayed"),
        past("c", outcome="replayed"),
        past("x", "operator:parked-retry"),
        past("d"),
    ]
    assert [p.message_id for p in effective(history)] == ["a", "b", "c", "d"]  # type: ignore[union-attr]
    # Retention purged an ended saga's replayed rows (not applied ones): the gap is named.
    gap = [past("a"), past("b"), reset, past("d")]
    assert effective(gap) == "retention purged the inputs an earlier reset replayed"
    assert effective(gap[:3]) == "retention purged the inputs an earlier reset replayed"


def _history(fixture: SagaFixture) -> list:  # type: ignore[type-arg]
    return list(fixture._engine.store.tables.history)
