"""The accounts service's book-keeping: balances and applied steps in its own PostgreSQL schema.

Every command is one step of one transfer, keyed by ``(transfer_id, step)``. The participant kit
already makes a redelivered command (same message id) a no-op; the step key also makes a new
command for a step already taken (a saga's retry, under a new message id) a no-op. The step row
is inserted first, so the primary key (not a lookup) decides, and it is written in the same
transaction as the balance change it records. The reply is stored on the row too: a repeated
step gets the very same reply, under the same message id, which the processor then recognises
as a duplicate.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from processor import Message, MessageRegistry
from processor.participant import Rows, Sql
from schemas.transfers import (
    CreditAccount,
    CreditConfirmed,
    CreditFailed,
    DebitAccount,
    DebitConfirmed,
    DebitFailed,
    ReverseDebit,
)
from schemas.wallets import (
    CompleteTransfer,
    InitiateTransfer,
    RefundTransfer,
    TransferCompleted,
    TransferFailed,
    TransferInitiated,
    TransferRefunded,
)

# The step each command performs; names are unique across both flows, so one table serves both.
STEP_OF: dict[type[Message], str] = {
    DebitAccount: "debit",
    CreditAccount: "credit",
    ReverseDebit: "reverse",
    InitiateTransfer: "initiate",
    CompleteTransfer: "complete",
    RefundTransfer: "refund",
}

APPLIED = "applied"

_DDL = """
CREATE TABLE IF NOT EXISTS {account} (
    account_id text          PRIMARY KEY,
    balance    numeric(18,2) NOT NULL CHECK (balance >= 0),
    open       boolean       NOT NULL DEFAULT true
);
CREATE TABLE IF NOT EXISTS {step} (
    transfer_id  text          NOT NULL,
    step         text          NOT NULL,
    outcome      text          NOT NULL,
    account_id   text,
    amount       numeric(18,2),
    reply_id     uuid,
    reply_type   text,
    reply_version int,
    reply        text,
    at           timestamptz   NOT NULL DEFAULT now(),
    PRIMARY KEY (transfer_id, step)
);
"""


@dataclass(frozen=True, slots=True)
class Reply:
    """An event to publish in answer to a command; ``message_id`` is fixed when first decided."""

    message_id: str
    type_name: str
    version: int
    value: str


@dataclass(frozen=True, slots=True)
class StepResult:
    outcome: str
    reply: Reply | None
    duplicate: bool


class Ledger:
    """Applies commands to balances, at most once per ``(transfer_id, step)``.

    Every method runs on the connection it is given, inside the caller's transaction (a
    command's, when the participant kit calls it).
    """

    def __init__(self, schema: str, registry: MessageRegistry) -> None:
        self.schema = schema
        self.registry = registry
        self._account = f'"{schema}".account'
        self._step = f'"{schema}".step'

    def create(self, sql: Sql) -> None:
        """Creates the tables in the (existing) schema."""
        sql.execute(_DDL.format(account=self._account, step=self._step))

    def open_accounts(
        self, sql: Sql, balances: Mapping[str, Decimal], closed: Iterable[str] = ()
    ) -> None:
        """Creates (or resets) accounts; ``closed`` ones keep their balance but refuse credits."""
        shut = set(closed)
        for account_id, balance in balances.items():
            self._x(
                sql,
                "INSERT INTO {account} (account_id, balance, open) VALUES (%s, %s, %s) "
                "ON CONFLICT (account_id) DO UPDATE SET balance = excluded.balance, "
                "open = excluded.open",
                account_id,
                balance,
                account_id not in shut,
            )

    def balances(self, sql: Sql) -> dict[str, Decimal]:
        rows = self._x(sql, "SELECT account_id, balance FROM {account} ORDER BY account_id")
        return {str(a): Decimal(b) for a, b in rows.fetchall()}

    def steps(self, sql: Sql) -> list[tuple[str, str, str]]:
        rows = self._x(sql, "SELECT transfer_id, step, outcome FROM {step} ORDER BY at")
        return [(str(t), str(s), str(o)) for t, s, o in rows.fetchall()]

    # -- applying one command; the caller holds the transaction ----------------------------

    def apply(self, sql: Sql, command: Message) -> StepResult:
        step = STEP_OF[type(command)]
        tid: str = getattr(command, "transfer_id")  # noqa: B009 - every command carries it
        claimed = self._x(
            sql,
            "INSERT INTO {step} (transfer_id, step, outcome) VALUES (%s, %s, 'pending') "
            "ON CONFLICT DO NOTHING RETURNING 1",
            tid,
            step,
        ).fetchone()
        if claimed is None:
            return self._replay(sql, tid, step)
        outcome, account_id, amount, reply = self._decide(sql, step, tid, command)
        stored = self._reply(reply) if reply is not None else None
        self._x(
            sql,
            "UPDATE {step} SET outcome = %s, account_id = %s, amount = %s, reply_id = %s, "
            "reply_type = %s, reply_version = %s, reply = %s WHERE transfer_id = %s AND step = %s",
            outcome,
            account_id,
            amount,
            stored.message_id if stored else None,
            stored.type_name if stored else None,
            stored.version if stored else None,
            stored.value if stored else None,
            tid,
            step,
        )
        return StepResult(outcome, stored, duplicate=False)

    def _decide(
        self, sql: Sql, step: str, tid: str, c: Any
    ) -> tuple[str, str | None, Decimal | None, Message | None]:
        """The business rule of each step: (outcome, account touched, amount moved, reply)."""
        why: str | None
        if step == "debit":
            if self._outcome(sql, tid, "reverse") is not None:
                # The saga already gave up on this transfer; a late debit must not take money.
                why = "transfer already reversed"
                return (
                    "refused",
                    None,
                    None,
                    DebitFailed(transfer_id=tid, account_id=c.account_id, reason=why),
                )
            why = self._take(sql, c.account_id, c.amount)
            if why:
                return (
                    why,
                    None,
                    None,
                    DebitFailed(transfer_id=tid, account_id=c.account_id, reason=why),
                )
            return APPLIED, c.account_id, c.amount, DebitConfirmed(**c.model_dump())
        if step == "credit":
            why = self._give(sql, c.account_id, c.amount, need_open=True)
            if why:
                return (
                    why,
                    None,
                    None,
                    CreditFailed(transfer_id=tid, account_id=c.account_id, reason=why),
                )
            return APPLIED, c.account_id, c.amount, CreditConfirmed(**c.model_dump())
        if step == "reverse":
            # At most once (the step key), and only what the debit really took, to where it came
            # from; no reply exists for a reversal.
            debit = self._applied(sql, tid, "debit")
            if debit is None:
                return "nothing-to-reverse", None, None, None
            self._give(sql, debit[0], debit[1], need_open=False)
            return APPLIED, debit[0], debit[1], None
        facts = {k: v for k, v in c.model_dump().items() if k != "step"}
        if step == "initiate":
            why = self._take(sql, c.from_wallet_id, c.amount)
            if why:
                return why, None, None, TransferFailed(**facts, reason=why)
            return APPLIED, c.from_wallet_id, c.amount, TransferInitiated(**facts)
        if step == "complete":
            if self._applied(sql, tid, "initiate") is None:
                why = "transfer not initiated"
            else:
                why = self._give(sql, c.to_wallet_id, c.amount, need_open=True)
            if why:
                return why, None, None, TransferFailed(**facts, reason=why)
            return APPLIED, c.to_wallet_id, c.amount, TransferCompleted(**facts)
        assert step == "refund", step
        # Forward-only: a refund is a new credit, made only when the source was debited and the
        # destination never got the money; otherwise it records that nothing was owed.
        initiated = self._applied(sql, tid, "initiate")
        if initiated is None or self._applied(sql, tid, "complete") is not None:
            return "nothing-to-refund", None, None, TransferRefunded(**facts)
        self._give(sql, initiated[0], initiated[1], need_open=False)
        return APPLIED, initiated[0], initiated[1], TransferRefunded(**facts)

    def _take(self, sql: Sql, account_id: str, amount: Decimal) -> str | None:
        row = self._x(
            sql,
            "UPDATE {account} SET balance = balance - %s WHERE account_id = %s AND balance >= %s "
            "RETURNING 1",
            amount,
            account_id,
            amount,
        ).fetchone()
        if row is not None:
            return None
        return "insufficient funds" if self._exists(sql, account_id) else "unknown account"

    def _give(self, sql: Sql, account_id: str, amount: Decimal, *, need_open: bool) -> str | None:
        row = self._x(
            sql,
            "UPDATE {account} SET balance = balance + %s "
            "WHERE account_id = %s AND (open OR NOT %s) RETURNING 1",
            amount,
            account_id,
            need_open,
        ).fetchone()
        if row is not None:
            return None
        return "account closed" if self._exists(sql, account_id) else "unknown account"

    def _exists(self, sql: Sql, account_id: str) -> bool:
        return (
            self._x(sql, "SELECT 1 FROM {account} WHERE account_id = %s", account_id).fetchone()
            is not None
        )

    def _outcome(self, sql: Sql, tid: str, step: str) -> str | None:
        row = self._x(
            sql, "SELECT outcome FROM {step} WHERE transfer_id = %s AND step = %s", tid, step
        ).fetchone()
        return str(row[0]) if row else None

    def _applied(self, sql: Sql, tid: str, step: str) -> tuple[str, Decimal] | None:
        row = self._x(
            sql,
            "SELECT account_id, amount FROM {step} WHERE transfer_id = %s AND step = %s "
            "AND outcome = 'applied'",
            tid,
            step,
        ).fetchone()
        return (str(row[0]), Decimal(row[1])) if row else None

    def _replay(self, sql: Sql, tid: str, step: str) -> StepResult:
        row = self._x(
            sql,
            "SELECT outcome, reply_id, reply_type, reply_version, reply FROM {step} "
            "WHERE transfer_id = %s AND step = %s",
            tid,
            step,
        ).fetchone()
        assert row is not None, "a conflicting step row is visible once its inserter committed"
        outcome, reply_id, type_name, version, value = row
        reply = Reply(str(reply_id), type_name, version, value) if reply_id is not None else None
        return StepResult(str(outcome), reply, duplicate=True)

    def _reply(self, message: Message) -> Reply:
        mtype = self.registry.of(type(message))
        return Reply(str(uuid.uuid4()), mtype.name, mtype.version, message.model_dump_json())

    def _x(self, sql: Sql, template: str, *args: Any) -> Rows:
        query = template.format(account=self._account, step=self._step)
        return sql.execute(query, args)
