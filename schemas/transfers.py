"""Messages of the account-to-account transfer saga (``sagas.transfer``).

Events are published by the account service to ``transfer-events``; commands go to
``account-commands``. Every message carries ``transfer_id``, the saga's correlation id, so the
account service can echo it back and deduplicate on it.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any

from pydantic import Field, GetCoreSchemaHandler, WithJsonSchema
from pydantic_core import core_schema

from processor import Message, message_type

__all__ = [
    "ACCOUNT_COMMANDS_TOPIC",
    "AMOUNT_PATTERN",
    "TRANSFER_EVENTS_TOPIC",
    "Amount",
    "CreditAccount",
    "CreditConfirmed",
    "CreditFailed",
    "DebitAccount",
    "DebitConfirmed",
    "DebitFailed",
    "ReverseDebit",
    "TransferRequested",
]

TRANSFER_EVENTS_TOPIC = "transfer-events"
ACCOUNT_COMMANDS_TOPIC = "account-commands"

AMOUNT_PATTERN = r"^(?:[1-9][0-9]{0,15}(?:\.[0-9]{1,2})?|0\.(?:0[1-9]|[1-9][0-9]?))$"
"""An amount on the wire: a JSON string, positive, at most 16 digits before the point and 2
after, no sign, exponent, spaces or separators ("12.50", "7", "0.05")."""

_AMOUNT = re.compile(AMOUNT_PATTERN)


def _json_amount(value: Any) -> Any:
    # The exported schema is the contract: what it refuses, the model refuses too. JSON numbers
    # are refused because binary floating point cannot say "to the cent" exactly.
    if not isinstance(value, str):
        raise ValueError('an amount is sent as a string, e.g. "12.50"')
    if not _AMOUNT.match(value):
        raise ValueError(f'an amount is a string matching {AMOUNT_PATTERN}, e.g. "12.50"')
    return value


def _python_amount(value: Any) -> Any:
    # In Python a Decimal (or a number) is an amount as it is; text must look as on the wire.
    if isinstance(value, str) and not _AMOUNT.match(value):
        raise ValueError(f'an amount is a string matching {AMOUNT_PATTERN}, e.g. "12.50"')
    return value


class _WireAmount:
    """The wire check, one validator per input mode.

    Two plain functions rather than one that asks the validation info for the mode: the info
    object pydantic builds per call costs more than the check itself, twice per transfer.
    """

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        inner = handler(source)
        return core_schema.json_or_python_schema(
            json_schema=core_schema.no_info_before_validator_function(_json_amount, inner),
            python_schema=core_schema.no_info_before_validator_function(_python_amount, inner),
        )


# The constraints come before the wire check: placed after it, pydantic cannot hand them to
# the core's decimal validator and checks them in Python, at several microseconds per amount.
# The check still runs first (a before-validator wraps what precedes it).
Amount = Annotated[
    Decimal,
    Field(gt=0, decimal_places=2, max_digits=18),
    _WireAmount(),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": AMOUNT_PATTERN,
            "examples": ["12.50"],
            "description": "A positive amount to the cent, as a decimal string.",
        }
    ),
]
"""A positive amount in the account's currency, to the cent; a decimal string on the wire."""


@message_type("transfers.TransferRequested", topic=TRANSFER_EVENTS_TOPIC)
class TransferRequested(Message):
    """A customer asked to move ``amount`` between two accounts; starts the saga."""

    transfer_id: str
    source_account_id: str
    target_account_id: str
    amount: Amount


@message_type("transfers.DebitConfirmed", topic=TRANSFER_EVENTS_TOPIC)
class DebitConfirmed(Message):
    """The source account was debited."""

    transfer_id: str
    account_id: str
    amount: Amount


@message_type("transfers.DebitFailed", topic=TRANSFER_EVENTS_TOPIC)
class DebitFailed(Message):
    """The source account could not be debited (e.g. insufficient funds); nothing moved."""

    transfer_id: str
    account_id: str
    reason: str


@message_type("transfers.CreditConfirmed", topic=TRANSFER_EVENTS_TOPIC)
class CreditConfirmed(Message):
    """The target account was credited."""

    transfer_id: str
    account_id: str
    amount: Amount


@message_type("transfers.CreditFailed", topic=TRANSFER_EVENTS_TOPIC)
class CreditFailed(Message):
    """The target account could not be credited (e.g. closed); the debit must be reversed."""

    transfer_id: str
    account_id: str
    reason: str


@message_type("transfers.DebitAccount", topic=ACCOUNT_COMMANDS_TOPIC)
class DebitAccount(Message):
    """Take ``amount`` from ``account_id``; answered by DebitConfirmed or DebitFailed."""

    transfer_id: str
    account_id: str
    amount: Amount


@message_type("transfers.CreditAccount", topic=ACCOUNT_COMMANDS_TOPIC)
class CreditAccount(Message):
    """Give ``amount`` to ``account_id``; answered by CreditConfirmed or CreditFailed."""

    transfer_id: str
    account_id: str
    amount: Amount


@message_type("transfers.ReverseDebit", topic=ACCOUNT_COMMANDS_TOPIC)
class ReverseDebit(Message):
    """Return a debited ``amount`` to ``account_id``.

    Sent on timeout too, when the saga cannot know whether the debit happened. So the account
    service applies it at most once per ``transfer_id``, only if the debit was applied, and
    refuses a DebitAccount for that transfer arriving after it; money is conserved either way.
    """

    transfer_id: str
    account_id: str
    amount: Amount
