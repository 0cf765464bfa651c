"""The failed outbox: list the rows the relay set aside, retry them in order, or discard them.

A row the relay could not publish (too large, unknown topic, not authorized, or the same
transient error too many times) is set aside with its reason, and the later rows of its saga are
held behind it. Once the cause is fixed (the topic created, the limit raised), a retry puts the
saga's rows back into the outbox in their original order; a discard drops them for good.
Every move is logged once, with saga type, saga id, message id and reason, never the payload.
"""

from __future__ import annotations

import logging

from processor._engine.rows import AuditEntry
from processor._errors import Refused, SagaError
from processor._ports import FailedOutboxRow, FailedOutboxStore
from processor._wire import HEADER_MESSAGE_ID

__all__ = [
    "NoFailedRows",
    "NothingSelected",
    "discard_failed_rows",
    "list_failed_rows",
    "retry_failed_rows",
]

log = logging.getLogger(__name__)


class NothingSelected(SagaError):
    """The selection names neither one saga nor one row, or no failed row matches it."""


class NoFailedRows(NothingSelected, Refused):
    """No failed row matches the selection: nothing was changed."""


def list_failed_rows(
    store: FailedOutboxStore,
    *,
    saga_type: str | None = None,
    saga_id: str | None = None,
    limit: int = 100,
) -> list[FailedOutboxRow]:
    """Failed and held rows in their original order, optionally of one saga type or saga."""
    if saga_id is not None and saga_type is None:
        raise NothingSelected("--saga-id needs --saga-type")
    return store.list_failed(saga_type, saga_id, limit)


def retry_failed_rows(
    store: FailedOutboxStore,
    *,
    saga_type: str | None = None,
    saga_id: str | None = None,
    row_id: int | None = None,
    actor: str | None = None,
    reason: str | None = None,
) -> list[FailedOutboxRow]:
    """Puts the selected rows back into the outbox, in their original order.

    A row id of a saga's row retries the whole saga (its failed row and every row held behind
    it). The relay publishes them again under their original message ids. With an ``actor``,
    the retry is recorded in the audit trail in the same transaction (who, ``reason``, ids).

    Raises:
        NothingSelected: The selection is incomplete.
        NoFailedRows: It matches no row.
    """
    _check(saga_type, saga_id, row_id)
    audit = _entry("outbox-retry", "retried", actor, reason, saga_type, saga_id, row_id)
    rows = store.retry_failed(saga_type=saga_type, saga_id=saga_id, row_id=row_id, audit=audit)
    _require(rows, saga_type, saga_id, row_id)
    for r in rows:
        log.warning("failed outbox row %d put back into the outbox: %s", r.id, _describe(r))
    return rows


def discard_failed_rows(
    store: FailedOutboxStore,
    *,
    reason: str,
    saga_type: str | None = None,
    saga_id: str | None = None,
    row_id: int | None = None,
    actor: str | None = None,
) -> list[FailedOutboxRow]:
    """Deletes the selected rows for good, logging each with ``reason``.

    A row id deletes that row alone: rows held behind it stay until retried or discarded.
    With an ``actor``, the discard is recorded in the audit trail in the same transaction.

    Raises:
        NothingSelected: The selection is incomplete, or no reason is given.
        NoFailedRows: It matches no row.
    """
    if not reason.strip():
        raise NothingSelected("a discard needs a reason")
    _check(saga_type, saga_id, row_id)
    audit = _entry("outbox-discard", "discarded", actor, reason, saga_type, saga_id, row_id)
    rows = store.discard_failed(saga_type=saga_type, saga_id=saga_id, row_id=row_id, audit=audit)
    _require(rows, saga_type, saga_id, row_id)
    for r in rows:
        log.warning("failed outbox row %d discarded (%s): %s", r.id, reason, _describe(r))
    return rows


def _check(saga_type: str | None, saga_id: str | None, row_id: int | None) -> None:
    by_saga = saga_type is not None and saga_id is not None
    partial = (saga_type is None) != (saga_id is None)
    if by_saga == (row_id is not None) or partial:
        raise NothingSelected("name either --saga-type and --saga-id, or --id")


def _entry(
    action: str,
    outcome: str,
    actor: str | None,
    reason: str | None,
    saga_type: str | None,
    saga_id: str | None,
    row_id: int | None,
) -> AuditEntry | None:
    if actor is None:
        return None
    selection = {"row_id": row_id} if row_id is not None else {}
    return AuditEntry(actor, action, reason, saga_type, saga_id, selection, outcome)


def _require(
    rows: list[FailedOutboxRow], saga_type: str | None, saga_id: str | None, row_id: int | None
) -> None:
    if not rows:
        what = f"row {row_id}" if row_id is not None else f"saga {saga_type} {saga_id}"
        raise NoFailedRows(f"no failed outbox rows for {what}")


def _describe(r: FailedOutboxRow) -> str:
    return (
        f"saga {r.row.saga_type} {r.row.saga_id}, message-id "
        f"{r.row.headers.get(HEADER_MESSAGE_ID)}, topic {r.row.topic}, reason: {r.reason}"
    )
