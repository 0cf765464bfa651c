"""A simulated accounts and wallet service on the participant kit: moves money, answers events.

The kit runs each command once in effect: the inbox row (by message id), the ledger's balance
change and step row (by transfer id and step, see ``ledger``), the reply and the partition's
position commit in one PostgreSQL transaction, and the processor's relay publishes the reply. A
crash anywhere redelivers the command, which is answered with the reply stored the first time.
It outlives restarts of PostgreSQL and of the broker: the kit rewinds, backs off and reconnects.

Faults for the demo and tests, chosen deterministically from the transfer id: the reply of a step
can be "lost" (applied, never sent), so the saga's payment timeout fires; or sent twice under one
message id, so the processor must recognise the duplicate; or the command itself can be passed
over (never applied, never recorded) on every delivery until ``release_dropped()``, as if it were
delayed in transit.

Run alone: ``python -m demo.accounts --help`` (defaults come from the processor's
``SAGA_*`` variables, so it can share the processor's environment).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any, TypeVar

import psycopg

import schemas  # noqa: F401 - registers the example message types
from demo.ledger import STEP_OF, Ledger
from processor import Message, MessageRegistry
from processor import message_registry as registry
from processor.participant import (
    ParticipantService,
    Replies,
    SkipDelivery,
    Sql,
    command_handler,
    participant,
)
from processor.settings import ConsumerSettings, RelaySettings
from schemas.transfers import (
    CreditAccount,
    DebitAccount,
    DebitFailed,
    ReverseDebit,
)
from schemas.wallets import CompleteTransfer, InitiateTransfer, RefundTransfer, TransferFailed

log = logging.getLogger(__name__)

T = TypeVar("T")
EXPIRED = "deadline passed before the command ran"


@dataclass(frozen=True)
class Selection:
    """Transfers picked for a fault: named ones, plus a fraction chosen by hashing the id.

    Hashing (not randomness) keeps the choice stable across redeliveries and restarts, so a
    redelivered command of a picked transfer is treated like the first one.
    """

    transfer_ids: frozenset[str] = frozenset()
    fraction: float = 0.0
    steps: frozenset[str] = frozenset({"debit"})

    def picks(self, transfer_id: str, step: str) -> bool:
        if step not in self.steps:
            return False
        if transfer_id in self.transfer_ids:
            return True
        digest = hashlib.sha256(transfer_id.encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.fraction


@dataclass
class Faults:
    """What the handlers did besides applying commands."""

    duplicates: int = 0
    lost: set[str] = field(default_factory=set)
    dropped: int = 0
    # Set by release_dropped(): from then on the picked commands are applied when delivered.
    released: threading.Event = field(default_factory=threading.Event)


@dataclass
class Counters:
    """The service's counters: the kit's and the faults'."""

    commands: int = 0
    duplicates: int = 0
    replies: int = 0
    lost: set[str] = field(default_factory=set)
    skipped: int = 0
    dropped: int = 0
    failed_batches: int = 0


@participant(name="accounts")
class Accounts:
    """Account and wallet commands, each one step of a transfer applied by the ledger."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        lose: Selection,
        duplicate: Selection,
        drop: Selection,
        message_registry: MessageRegistry,
    ) -> None:
        self.ledger = ledger
        self.lose = lose
        self.duplicate = duplicate
        self.drop = drop
        self.registry = message_registry
        self.faults = Faults()

    def _step(self, sql: Sql, command: Message, replies: Replies) -> None:
        tid: str = getattr(command, "transfer_id")  # noqa: B009 - every command carries it
        step = STEP_OF[type(command)]
        if self.drop.picks(tid, step) and not self.faults.released.is_set():
            # Passed over unrecorded, every time: the broker, the relay or a rewind may deliver
            # the command again before the delay it stands for is over.
            self.faults.dropped += 1
            raise SkipDelivery
        result = self.ledger.apply(sql, command)
        self.faults.duplicates += result.duplicate
        if result.reply is None:
            return
        if self.lose.picks(tid, step):
            self.faults.lost.add(tid)
            return
        reply = result.reply
        message = self.registry.by_name(reply.type_name, reply.version).cls.model_validate_json(
            reply.value
        )
        for _ in range(2 if self.duplicate.picks(tid, step) else 1):
            replies.send(message, key=tid, message_id=reply.message_id)

    @command_handler(
        expired=lambda c: DebitFailed(
            transfer_id=c.transfer_id, account_id=c.account_id, reason=EXPIRED
        )
    )
    def debit(self, command: DebitAccount, replies: Replies, sql: Sql) -> None:
        self._step(sql, command, replies)

    # Credits and reversals move money the saga already took: never skipped for time.
    @command_handler()
    def credit(self, command: CreditAccount, replies: Replies, sql: Sql) -> None:
        self._step(sql, command, replies)

    @command_handler()
    def reverse(self, command: ReverseDebit, replies: Replies, sql: Sql) -> None:
        self._step(sql, command, replies)

    @command_handler(
        expired=lambda c: TransferFailed(
            **{k: v for k, v in c.model_dump().items() if k != "step"}, reason=EXPIRED
        )
    )
    def initiate(self, command: InitiateTransfer, replies: Replies, sql: Sql) -> None:
        self._step(sql, command, replies)

    @command_handler()
    def complete(self, command: CompleteTransfer, replies: Replies, sql: Sql) -> None:
        self._step(sql, command, replies)

    @command_handler()
    def refund(self, command: RefundTransfer, replies: Replies, sql: Sql) -> None:
        self._step(sql, command, replies)


class BoundLedger:
    """The ledger's reads, each in a transaction of its own."""

    def __init__(self, ledger: Ledger, run: Callable[[Callable[[Sql], Any]], Any]) -> None:
        self._ledger = ledger
        self._run = run

    def balances(self) -> dict[str, Decimal]:
        result: dict[str, Decimal] = self._run(self._ledger.balances)
        return result

    def steps(self) -> list[tuple[str, str, str]]:
        result: list[tuple[str, str, str]] = self._run(self._ledger.steps)
        return result

    def total(self) -> Decimal:
        return sum(self.balances().values(), Decimal(0))


class AccountsService:
    """The accounts participant as a service; ``run()`` consumes until stopped."""

    def __init__(
        self,
        *,
        kafka: Mapping[str, str],
        database_url: str,
        schema: str,
        topic_prefix: str = "",
        group_id: str | None = None,
        lose: Selection = Selection(),
        duplicate: Selection = Selection(),
        drop: Selection = Selection(),
        batch_size: int = 200,
        message_registry: MessageRegistry = registry,
        application_name: str = "demo-accounts",
    ) -> None:
        self.accounts = Accounts(
            Ledger(schema, message_registry),
            lose=lose,
            duplicate=duplicate,
            drop=drop,
            message_registry=message_registry,
        )
        self.service = ParticipantService(
            [self.accounts],
            kafka=kafka,
            database_url=database_url,
            schema=schema,
            group_id=group_id or f"{topic_prefix}accounts",
            topic_prefix=topic_prefix,
            consumer=ConsumerSettings(batch_size=batch_size, session_timeout=timedelta(seconds=10)),
            relay=RelaySettings(poll_interval=timedelta(milliseconds=200)),
            message_registry=message_registry,
            application_name=application_name,
        )
        self.stop_event = self.service.stop_event
        # Set-up and reads from other threads (a test's checks while the service runs) each
        # take a connection of their own: one serves one transaction at a time, the service's
        # store is its consumer's, and a kept one would be stale after a database restart.
        self._url = database_url
        self._reads_name = f"{application_name}-reads"
        self.ledger = BoundLedger(self.accounts.ledger, self._in_transaction)
        self._in_transaction(self.accounts.ledger.create)

    def _in_transaction(self, work: Callable[[Sql], T]) -> T:
        # The ledger's statements name its schema: a plain connection serves them.
        with (
            psycopg.connect(self._url, application_name=self._reads_name) as conn,
            conn.transaction(),
        ):
            return work(conn)

    def open_accounts(self, balances: Mapping[str, Decimal], closed: Iterable[str] = ()) -> None:
        self._in_transaction(lambda sql: self.accounts.ledger.open_accounts(sql, balances, closed))

    @property
    def counters(self) -> Counters:
        kit = self.service.kit.counters
        faults = self.accounts.faults
        return Counters(
            commands=kit.handled + kit.duplicates + kit.expired + kit.dead_lettered + kit.skipped,
            duplicates=kit.duplicates + faults.duplicates,
            replies=kit.replies,
            lost=set(faults.lost),
            skipped=kit.dead_lettered,
            dropped=faults.dropped,
            failed_batches=self.service.failed_rounds,
        )

    def release_dropped(self) -> None:
        """Ends the delay of the ``drop`` selection: its commands apply from their next delivery."""
        self.accounts.faults.released.set()

    @property
    def reconnects(self) -> int:
        """Database connections replaced after a failure."""
        return self.service.store.reconnects

    def run(self, stop: threading.Event | None = None) -> None:
        """Consumes and answers commands until ``stop`` (or ``self.stop_event``) is set."""
        self.service.run(stop)

    def total(self) -> Decimal:
        """Sum of every balance; equal before and after any set of finished transfers."""
        return self.ledger.total()

    def close(self) -> None:
        self.service.close()


# -- command line ------------------------------------------------------------------------------


def _balances(text: str) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, amount = item.partition("=")
        out[name] = Decimal(amount or "0")
    return out


def _ids(text: str) -> frozenset[str]:
    return frozenset(filter(None, (p.strip() for p in text.split(","))))


def main(argv: Sequence[str] | None = None) -> int:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m demo.accounts", description=__doc__)
    p.add_argument("--bootstrap", default=env("SAGA_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:19092"))
    p.add_argument(
        "--database-url",
        default=env("SAGA_DATABASE__URL", "postgresql://saga:saga@127.0.0.1:55432/saga"),
    )
    p.add_argument("--schema", default=env("ACCOUNTS_SCHEMA", "demo_accounts"))
    p.add_argument("--prefix", default=env("SAGA_TOPIC_PREFIX", ""), help="topic prefix")
    p.add_argument("--accounts", default="", help="open accounts, e.g. A=100,B=50.00")
    p.add_argument("--closed", default="", help="comma-separated accounts that refuse credits")
    p.add_argument("--lose", default="", help="transfer ids whose debit replies are lost")
    p.add_argument("--lose-fraction", type=float, default=0.0)
    p.add_argument("--duplicate-fraction", type=float, default=0.0)
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    steps = frozenset(STEP_OF.values())
    service = AccountsService(
        kafka={"bootstrap.servers": args.bootstrap},
        database_url=args.database_url,
        schema=args.schema,
        topic_prefix=args.prefix,
        lose=Selection(_ids(args.lose), args.lose_fraction),
        duplicate=Selection(fraction=args.duplicate_fraction, steps=steps),
    )
    balances = _balances(args.accounts)
    closed = _ids(args.closed)
    if balances or closed:
        service.open_accounts({**dict.fromkeys(closed, Decimal(0)), **balances}, closed)
    signal.signal(signal.SIGTERM, lambda *_: service.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: service.stop_event.set())
    log.info("accounts service up: schema %s, prefix %r", args.schema, args.prefix)
    service.run()
    c = service.counters
    log.info(
        "stopped: %d commands, %d duplicates, %d replies, %d lost",
        c.commands,
        c.duplicates,
        c.replies,
        len(c.lost),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
