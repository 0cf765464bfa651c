"""Operator-facing log lines: one per parked saga and dead letter, never a payload value."""

from __future__ import annotations

import logging

import pytest

from processor._engine.records import Record
from processor._engine.rows import DeadLetter, ParkedMessage, WriteSet
from processor._runtime.report import (
    DEAD_LETTER_LINES,
    report_committed,
    report_failed_outbox,
    safe_traceback,
)
from tests.unit.test_plan import Gate, Log, Opened, _loaded, _plan, _planner

SECRET = "4111-1111-1111-1111"


def _record(offset: int, message_id: str = "m-1") -> Record:
    return Record(
        topic="in",
        partition=2,
        offset=offset,
        key=b"saga-7",
        value=f'{{"card": "{SECRET}"}}'.encode(),
        headers=(
            ("message-id", message_id.encode()),
            ("message-type", b"transfers.TransferRequested"),
            ("note", SECRET.encode()),
        ),
    )


def test_a_parked_saga_is_one_error_line_and_held_messages_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ws = WriteSet(
        parked=[
            ParkedMessage("transfer", "saga-7", _record(10), "on_requested: KeyError"),
            ParkedMessage("transfer", "saga-7", _record(11, "m-2"), "behind a parked saga"),
            ParkedMessage("transfer", "saga-7", _record(12, "m-3"), "behind a parked saga"),
        ]
    )
    with caplog.at_level(logging.INFO, logger="processor.report"):
        report_committed(ws)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(errors) == 1
    line = errors[0].getMessage()
    for part in ("saga_type=transfer", "saga_id=saga-7", "message_id=m-1", "in/2@10", "KeyError"):
        assert part in line
    assert len(warnings) == 1
    assert "2 more message(s) held" in warnings[0].getMessage()
    assert SECRET not in caplog.text


def test_dead_letters_are_capped_per_batch_with_a_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    n = DEAD_LETTER_LINES + 5
    ws = WriteSet(
        dead_letters=[
            DeadLetter(_record(i, f"m-{i}"), "undecodable", "ValidationError") for i in range(n)
        ]
    )
    with caplog.at_level(logging.WARNING, logger="processor.report"):
        report_committed(ws)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == DEAD_LETTER_LINES + 1
    assert "message_id=m-0" in lines[0]
    assert "reason: undecodable (ValidationError)" in lines[0]
    assert lines[-1].startswith("5 more dead letters")
    assert SECRET not in caplog.text


def test_ids_cannot_forge_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="processor.report"):
        report_failed_outbox(
            saga_type="t",
            saga_id="x\nFAKE ERROR line\x00",
            message_id=None,
            topic="out",
            reason="MSG_SIZE_TOO_LARGE",
        )
    [rec] = caplog.records
    assert "\n" not in rec.getMessage()
    assert "\x00" not in rec.getMessage()
    assert "MSG_SIZE_TOO_LARGE" in rec.getMessage()


def test_safe_traceback_names_frames_and_types_but_not_the_exception_text() -> None:
    def load() -> None:
        raise ValueError(f"input_value={SECRET}")

    try:
        try:
            load()
        except ValueError as inner:
            raise RuntimeError("wrapped " + SECRET) from inner
    except RuntimeError as e:
        text = safe_traceback(e)
    assert "in load" in text
    assert "builtins.ValueError" in text
    assert "builtins.RuntimeError" in text
    assert SECRET not in text


def test_a_handler_error_that_parks_a_saga_is_logged_with_its_frames(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = Log()
    ws = _plan(_planner(Gate(failures=10)), [log.event(Opened(order_id="o1"))], _loaded())
    [parked] = ws.parked
    assert parked.error is not None
    with caplog.at_level(logging.INFO, logger="processor.report"):
        report_committed(ws)
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    # The handler's own frame and the error's type: where the code failed.
    assert "Traceback (most recent call last, exception text left out)" in line
    assert ", in opened" in line
    assert "processor._errors.HandlerError" in line
