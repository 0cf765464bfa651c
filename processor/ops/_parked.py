"""Parked sagas: list them, and replay their held messages once the cause is fixed.

A saga is parked when a handler keeps raising; every later message for it is held in
`parked_message` so that nothing overtakes the failed one. An operator's retry replays the held
messages in the order they arrived (``processor._runtime.resume``, the same replay the processor
runs by itself for sagas parked on a newer version), all or nothing, and records who asked and
why in the saga's history and the audit trail.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Unpack

from processor._engine.plan import Planner
from processor._engine.rows import AuditEntry, HistoryRow, Outcome, WriteSet
from processor._ports import HeldMessage, OperatorStore, ParkedSaga, ParkedStore
from processor._runtime.resume import (
    NotParked,
    ReplayOptions,
    ReplayOutcome,
    RetryFailure,
    RetryResult,
    replay_parked,
)
from processor._wire import HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE

__all__ = [
    "NotParked",
    "ParkedSaga",
    "ReplayOutcome",
    "RetryFailure",
    "RetryResult",
    "list_parked",
    "retry_parked_saga",
]


def list_parked(store: OperatorStore, limit: int = 100) -> list[ParkedSaga]:
    """Parked saga instances, longest parked first.

    Args:
        store: The processor's database, e.g. `processor._postgres.reads.operator.OperatorQueries`.
        limit: Maximum number of sagas returned.
    """
    return store.parked_sagas(limit)


def retry_parked_saga(
    store: ParkedStore,
    planner: Planner,
    saga_type: str,
    saga_id: str,
    *,
    by: str | None = None,
    reason: str | None = None,
    **options: Unpack[ReplayOptions],
) -> RetryResult:
    """The operator's retry: :func:`~processor._runtime.resume.replay_parked`, recorded.

    The held messages are replayed in arrival order, all or nothing, as the replay does; who
    asked and why go into the saga's history and the audit trail in the same transaction, with
    each message skipped (``parked skip``: the message that keeps failing) as ``skipped``.

    Args:
        store: The processor's database, e.g. `processor._postgres.reads.operator.OperatorQueries`,
        on
            an idle connection; the retry commits or rolls back its own transaction on it.
        planner: The planner the processor runs, built from the (fixed) saga classes (see
            `processor._runtime.assembly.bind_sagas`).
        saga_type: The parked saga's type name.
        saga_id: The parked saga's id.
        by: Who asked; with ``reason``, recorded in the saga's history.
        reason: Why.
        **options: ``registry``, ``max_record_bytes``, ``skip``: see
            :class:`~processor._runtime.resume.ReplayOptions`.

    Returns:
        What happened; `result.failure` names the message that failed again, if one did.

    Raises:
        NotParked: The saga does not exist or is not parked.
        ConcurrentUpdate: The instance changed under the retry (it is safe to run it again).
    """
    skip = options.get("skip", 0)

    def annotate(ws: WriteSet, held: Sequence[HeldMessage]) -> None:
        _record_operator(ws, saga_type, saga_id, held, skip, by, reason)

    return replay_parked(
        store,
        planner,
        saga_type,
        saga_id,
        annotate=annotate if by is not None or skip else None,
        **options,
    )


def _record_operator(
    ws: WriteSet,
    saga_type: str,
    saga_id: str,
    held: Sequence[HeldMessage],
    skip: int,
    by: str | None,
    reason: str | None,
) -> None:
    """Puts the operator's retry (or skip) first in the replay's writes.

    The timeline gets a row for the retry and one per skipped message, the audit trail one
    entry naming the messages skipped.
    """
    action = "parked-skip" if skip else "parked-retry"
    label = f"operator {action} by {by or 'unknown'}: {reason or '-'}"[:1000]
    first = held[0].record if held else None
    rows = [
        HistoryRow(
            saga_type,
            saga_id,
            f"operator:{uuid.uuid4().hex}",
            f"operator:{action}",
            "operator",
            Outcome.APPLIED,
            None,
            first.topic if first else "",
            first.partition if first else -1,
            first.offset if first else -1,
            label,
        )
    ]
    for h in held[:skip]:
        r = h.record
        rows.append(
            HistoryRow(
                saga_type,
                saga_id,
                r.header(HEADER_MESSAGE_ID) or f"parked:{h.parked_id}",
                r.header(HEADER_MESSAGE_TYPE) or "unknown",
                "event",
                Outcome.SKIPPED,
                None,
                r.topic,
                r.partition,
                r.offset,
                label,
            )
        )
    target: dict[str, object] = {"held": len(held)}
    if skip:
        target["skipped"] = [
            h.record.header(HEADER_MESSAGE_ID) or f"parked:{h.parked_id}" for h in held[:skip]
        ]
    ws.history[:0] = rows
    ws.audit.insert(0, AuditEntry(by or "unknown", action, reason, saga_type, saga_id, target))
