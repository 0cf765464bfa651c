"""Parked sagas: list them, and replay their held messages once the cause is fixed.

A saga is parked when a handler keeps raising; every later message for it is held in
`parked_message` so that nothing overtakes the failed one. An operator's retry replays the held
messages in the order they arrived (``processor.runtime.resume``, the same replay the processor
runs by itself for sagas parked on a newer version), all or nothing, and records who asked and
why in the saga's history and the audit trail.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Sequence

from processor.engine.plan import Planner
from processor.engine.rows import AuditEntry, HistoryRow, Outcome, WriteSet
from processor.messages import MessageRegistry
from processor.ports import HeldMessage, OperatorStore, ParkedSaga, ParkedStore
from processor.runtime.resume import (
    NotParked,
    ReplayOutcome,
    RetryFailure,
    RetryResult,
    replay_parked,
)
from processor.wire import HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE

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
        store: The processor's database, e.g. `processor.postgres.operator.OperatorQueries`.
        limit: Maximum number of sagas returned.
    """
    return store.parked_sagas(limit)


def retry_parked_saga(
    store: ParkedStore,
    planner: Planner,
    saga_type: str,
    saga_id: str,
    *,
    registry: MessageRegistry,
    max_record_bytes: int = sys.maxsize,
    skip: int = 0,
    by: str | None = None,
    reason: str | None = None,
) -> RetryResult:
    """Replays a parked saga's held messages in arrival order, all or nothing.

    The instance is planned as active (or as not yet started, when its start handler was the
    one that failed), so its handlers run on the held messages exactly as the consumer would
    have run them. On success the held rows are deleted and the saga's state, history, commands
    and deadlines are written in the same transaction; the relay is woken by the usual notify.

    Args:
        store: The processor's database, e.g. `processor.postgres.operator.OperatorQueries`, on
            an idle connection; the retry commits or rolls back its own transaction on it.
        planner: The planner the processor runs, built from the (fixed) saga classes (see
            `processor.runtime.assembly.bind_sagas`).
        saga_type: The parked saga's type name.
        saga_id: The parked saga's id.
        registry: Message types, to decode the held records; the planner's own.
        max_record_bytes: Size limit applied when decoding; held records already passed the
            consumer's limit once, so the default does not check again.
        skip: How many of the first held messages to drop instead of replaying (``parked
            skip``: the message that keeps failing); each is recorded as ``skipped``.
        by: Who asked; with ``reason``, recorded in the saga's history.
        reason: Why.

    Returns:
        What happened; `result.failure` names the message that failed again, if one did.

    Raises:
        NotParked: The saga does not exist or is not parked.
        ConcurrentUpdate: The instance changed under the retry (it is safe to run it again).
    """

    def annotate(ws: WriteSet, held: Sequence[HeldMessage]) -> None:
        ws.history[:0] = _operator_rows(saga_type, saga_id, held, skip, by, reason)
        ws.audit.insert(0, _audit_entry(saga_type, saga_id, held, skip, by, reason))

    return replay_parked(
        store,
        planner,
        saga_type,
        saga_id,
        registry=registry,
        max_record_bytes=max_record_bytes,
        skip=skip,
        annotate=annotate if by is not None or skip else None,
    )


def _operator_rows(
    saga_type: str,
    saga_id: str,
    held: Sequence[HeldMessage],
    skip: int,
    by: str | None,
    reason: str | None,
) -> list[HistoryRow]:
    """The timeline's record of the operator's retry (or skip), and of each skipped message."""
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
    return rows


def _audit_entry(
    saga_type: str,
    saga_id: str,
    held: Sequence[HeldMessage],
    skip: int,
    by: str | None,
    reason: str | None,
) -> AuditEntry:
    """The audit trail's record of the retry (or skip), written with the replay."""
    target: dict[str, object] = {"held": len(held)}
    if skip:
        target["skipped"] = [
            h.record.header(HEADER_MESSAGE_ID) or f"parked:{h.parked_id}" for h in held[:skip]
        ]
    action = "parked-skip" if skip else "parked-retry"
    return AuditEntry(by or "unknown", action, reason, saga_type, saga_id, target)
