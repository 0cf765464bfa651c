"""S10's participant: the account service of the transfer saga on the participant kit, doing
nothing but answering (see :mod:`benchmarks.s10_saga`), in a process of its own.

A participant is a service apart from the processor, so it runs as one: ``python -m
benchmarks.s10_participant SPEC_JSON`` runs until SIGTERM. The kit still does its own part of
every command (inbox row, reply in its outbox, position, one transaction per batch), as a
participant in production would; only the handlers' business work is left out.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from datetime import timedelta
from typing import Any

import schemas  # noqa: F401 - registers the transfer messages
from benchmarks.common import kafka_config
from benchmarks.s10_saga import credit_refused
from processor.participant import ParticipantService, Replies, command_handler, participant
from processor.settings import ConsumerSettings, RelaySettings
from schemas.transfers import (
    CreditAccount,
    CreditConfirmed,
    CreditFailed,
    DebitAccount,
    DebitConfirmed,
    ReverseDebit,
)

BATCH_SIZE = 500
GROUP = "s10-accounts"


@participant(name="s10-accounts")
class TrivialAccounts:
    """Confirms every debit, refuses the credits ``credit_refused`` picks, takes reversals."""

    @command_handler()
    def debit(self, command: DebitAccount, replies: Replies) -> None:
        replies.send(
            DebitConfirmed(
                transfer_id=command.transfer_id,
                account_id=command.account_id,
                amount=command.amount,
            )
        )

    @command_handler()
    def credit(self, command: CreditAccount, replies: Replies) -> None:
        if credit_refused(command.transfer_id):
            replies.send(
                CreditFailed(
                    transfer_id=command.transfer_id,
                    account_id=command.account_id,
                    reason="refused",
                )
            )
            return
        replies.send(
            CreditConfirmed(
                transfer_id=command.transfer_id,
                account_id=command.account_id,
                amount=command.amount,
            )
        )

    @command_handler()
    def reverse(self, command: ReverseDebit) -> None:
        """The saga ended with the reversal sent: nothing to answer."""


def service(spec: dict[str, Any]) -> ParticipantService:
    return ParticipantService(
        [TrivialAccounts()],
        kafka=kafka_config(spec["kafka"]),
        database_url=spec["database_url"],
        schema=spec["schema"],
        group_id=spec["prefix"] + GROUP,
        topic_prefix=spec["prefix"],
        consumer=ConsumerSettings(batch_size=BATCH_SIZE, session_timeout=timedelta(seconds=10)),
        relay=RelaySettings(),
        application_name="s10-participant",
    )


def main(spec: dict[str, Any]) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    accounts = service(spec)
    signal.signal(signal.SIGTERM, lambda _sig, _frame: accounts.stop())
    try:
        accounts.run()
    finally:
        accounts.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
