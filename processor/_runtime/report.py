"""Logs what an operator must hear about: parked sagas, dead letters, failed outbox rows.

Each is logged once, when the batch (or relay round) that decided it has committed, at WARNING
or ERROR, with what identifies it (saga type, saga id, message id, source position) and the
reason. Payload values never reach the log: not the record's value, not its headers beyond the
identifying ones, and for code errors a traceback of frames and exception type only, because an
exception's text (a pydantic error, say) may echo the data that caused it.
"""

from __future__ import annotations

import logging
import traceback
from collections import Counter
from collections.abc import Iterable

from processor._engine.records import Record
from processor._engine.rows import ParkedMessage, WriteSet
from processor._observe.logs import trace_id
from processor._wire import (
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_SAGA_ID,
    HEADER_SAGA_TYPE,
    HEADER_TRACEPARENT,
)

__all__ = [
    "DEAD_LETTER_LINES",
    "report_committed",
    "report_dead_letters",
    "report_failed_outbox",
    "report_parked",
    "safe_traceback",
]

log = logging.getLogger("processor.report")

DEAD_LETTER_LINES = 100
"""Most dead letters logged one per line per batch; the rest are counted in a summary line."""

# The plan's reason for a message that waits behind an already parked saga: the saga was
# reported when it was parked, so these are only counted.
_BEHIND = "behind a parked saga"
_REASON_CHARS = 500


def report_committed(ws: WriteSet) -> None:
    """Logs the parked sagas and dead letters of a batch that has just committed."""
    if ws.parked:
        report_parked(ws.parked)
    if ws.dead_letters:
        report_dead_letters((d.record, d.reason, d.detail) for d in ws.dead_letters)


def report_parked(parked: Iterable[ParkedMessage]) -> None:
    """One ERROR line per saga parked by the batch; one WARNING line per saga held behind."""
    held: Counter[tuple[str, str]] = Counter()
    for p in parked:
        if p.reason == _BEHIND:
            held[(p.saga_type, p.saga_id)] += 1
            continue
        log.error(
            "saga parked: saga_type=%s saga_id=%s message_id=%s message_type=%s at %s; "
            "reason: %s%s",
            _clip(p.saga_type, 100),
            _clip(p.saga_id, 100),
            _message_id(p.record),
            _message_type(p.record),
            _position(p.record),
            _clip(p.reason),
            safe_traceback(p.error) if p.error is not None else "",
            extra=_ids(p.record, p.saga_type, p.saga_id),
        )
    for (saga_type, saga_id), n in held.items():
        log.warning(
            "saga_type=%s saga_id=%s: %d more message(s) held behind its parking",
            _clip(saga_type, 100),
            _clip(saga_id, 100),
            n,
        )


def report_dead_letters(letters: Iterable[tuple[Record, str, str]]) -> None:
    """One WARNING line per dead letter, up to :data:`DEAD_LETTER_LINES`, then one summary."""
    reasons: Counter[str] = Counter()
    for n, (record, reason, detail) in enumerate(letters):
        reasons[reason] += 1
        if n < DEAD_LETTER_LINES:
            log.warning(
                "dead letter: message_id=%s message_type=%s saga_type=%s saga_id=%s at %s; "
                "reason: %s (%s)",
                _message_id(record),
                _message_type(record),
                _clip(record.header(HEADER_SAGA_TYPE) or "-", 100),
                _clip(record.header(HEADER_SAGA_ID) or "", 100) or _key(record),
                _position(record),
                reason,
                _clip(detail),
                extra=_ids(record, record.header(HEADER_SAGA_TYPE), record.header(HEADER_SAGA_ID)),
            )
    skipped = sum(reasons.values()) - DEAD_LETTER_LINES
    if skipped > 0:
        log.warning(
            "%d more dead letters in the same batch, not logged one by one; by reason: %s",
            skipped,
            dict(reasons),
        )


def report_failed_outbox(
    *,
    saga_type: str | None,
    saga_id: str | None,
    message_id: str | None,
    topic: str,
    reason: str,
) -> None:
    """One ERROR line for an outbox row set aside because it cannot be published."""
    log.error(
        "outbox row failed: saga_type=%s saga_id=%s message_id=%s topic=%s; reason: %s",
        _clip(saga_type or "-", 100),
        _clip(saga_id or "-", 100),
        _clip(message_id or "-", 100),
        _clip(topic, 250),
        _clip(reason),
        extra={
            "saga_type": _clip(saga_type or "-", 100),
            "saga_id": _clip(saga_id or "-", 100),
            "message_id": _clip(message_id or "-", 100),
            "topic": _clip(topic, 250),
        },
    )


def safe_traceback(error: BaseException) -> str:
    """The frames of ``error``'s traceback and its type, without the exception's text.

    An exception's message may quote the data that caused it; the frames (file, line, code
    line) say where the code failed, which is what the log is for.
    """
    lines: list[str] = []
    current: BaseException | None = error
    while current is not None and len(lines) < 200:
        frames = "".join(traceback.format_tb(current.__traceback__))
        lines.append(f"{frames}{type(current).__module__}.{type(current).__qualname__}")
        current = current.__cause__
        if current is not None:
            lines.append("caused by:")
    return "\nTraceback (most recent call last, exception text left out):\n" + "\n".join(lines)


def _ids(record: Record, saga_type: str | None, saga_id: str | None) -> dict[str, object]:
    """The ``extra=`` fields of a line about ``record`` (the JSON log format emits them)."""
    ids: dict[str, object] = {
        "message_id": _message_id(record),
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
    }
    if saga_type:
        ids["saga_type"] = _clip(saga_type, 100)
    if saga_id:
        ids["saga_id"] = _clip(saga_id, 100)
    trace = trace_id(record.header(HEADER_TRACEPARENT))
    if trace is not None:
        ids["trace_id"] = trace
    return ids


def _message_id(record: Record) -> str:
    return _clip(record.header(HEADER_MESSAGE_ID) or "-", 100)


def _message_type(record: Record) -> str:
    return _clip(record.header(HEADER_MESSAGE_TYPE) or "-", 100)


def _key(record: Record) -> str:
    return _clip(record.key.decode("utf-8", errors="replace"), 100) if record.key else "-"


def _position(record: Record) -> str:
    return f"{record.topic}/{record.partition}@{record.offset}"


def _clip(text: str, limit: int = _REASON_CHARS) -> str:
    # Ids and reasons come from outside; a NUL or a newline must not split or forge log lines.
    cleaned = text.replace("\x00", "\\0").replace("\n", " ").replace("\r", " ")
    return cleaned if len(cleaned) <= limit else cleaned[:limit] + "..."
