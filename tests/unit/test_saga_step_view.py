"""`show`'s step in flight, `sagas list`'s filters and cursor, and `show --follow`'s loop."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

import pytest

from processor._cli import main
from processor._cli.follow import follow, format_step
from processor._errors import SagaError
from processor._ports.views import PendingDeadline, SagaSummary, SagaView, TimelineEntry
from processor.ops._filters import cursor, list_filters
from processor.ops._progress import step_progress

AT = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def _timer(purpose: str, attempt: int, phase: str = "forward") -> PendingDeadline:
    payload = {"step": "ship", "phase": phase, "purpose": purpose, "attempt": attempt}
    return PendingDeadline("d-1", "machine.step", AT, None, payload)


def test_a_step_waiting_for_its_reply_shows_its_attempt_timeout_and_last_failure() -> None:
    state = {"progress": {"step": "ship", "attempt": 2, "reason": "step ship failed: down"}}
    step = step_progress(state, [PendingDeadline("x", "remind", AT, None), _timer("timeout", 2)])
    assert step is not None
    assert (step.step, step.phase, step.attempt, step.waiting, step.due_at) == (
        "ship",
        "forward",
        2,
        "timeout",
        AT,
    )
    assert (step.next_attempt, step.last_failure) == (None, "step ship failed: down")
    assert format_step(step) == [
        f"step      ship, attempt 2, times out {AT.isoformat()}",
        "failure   step ship failed: down",
    ]


def test_a_step_backing_off_shows_the_next_attempt_and_when() -> None:
    state = {"progress": {"step": "ship", "attempt": 1, "reason": "step ship failed: down"}}
    step = step_progress(state, [_timer("retry", 1)])
    assert step is not None
    assert (step.waiting, step.next_attempt) == ("retry", 2)
    assert format_step(step)[0] == f"step      ship, attempt 1, attempt 2 due {AT.isoformat()}"
    # An open breaker sends the same attempt again.
    resumed = step_progress(state, [_timer("resume", 1)])
    assert resumed is not None
    assert resumed.next_attempt == 1


def test_an_undo_in_flight_and_its_failure() -> None:
    state = {"progress": {"attempt": 3, "undo_queue": ["pay"], "undo_failure": "refund down"}}
    step = step_progress(state, [])
    assert step is not None
    assert (step.step, step.phase, step.attempt, step.last_failure) == (
        "pay",
        "undo",
        3,
        "refund down",
    )
    assert format_step(step)[0] == "step      undo of pay, attempt 3"


def test_nothing_for_plain_sagas_and_idle_orchestrations() -> None:
    assert step_progress(None, []) is None
    assert step_progress({"state_label": "X"}, [_timer("timeout", 1)]) is None
    assert step_progress({"progress": {"attempt": 0, "completed": ["ship"]}}, []) is None
    assert format_step(None) == []


def test_list_filters_name_the_option_at_fault() -> None:
    names = {"outcome": "--outcome", "older_than": "--older-than", "attr": "--state-contains"}
    with pytest.raises(SagaError, match=r"^bad --outcome: one of COMPLETED"):
        list_filters({"outcome": "DONE"}, names)
    with pytest.raises(SagaError, match=r"^bad --older-than: "):
        list_filters({"older_than": "soon"}, names)
    with pytest.raises(SagaError, match=r"^bad --state-contains: search the state"):
        list_filters({"attr": "no-equals"}, names)
    # The console's own names by default.
    with pytest.raises(SagaError, match=r"^bad parameter after: "):
        list_filters({"after": "nonsense"})


def test_a_cursor_reads_back_as_the_next_pages_after() -> None:
    row = SagaSummary("order-saga", "o|1", "active", "RUNNING", AT, 3, AT, AT, None)
    filters = list_filters({"after": cursor(row), "attr": "customer_id=c-7", "type": "t"})
    assert filters["after"] == (AT, "order-saga", "o|1")
    assert filters["saga_type"] == "t"
    assert filters["state_contains"] == [{"customer_id": "c-7"}]


def test_sagas_list_refuses_a_bad_filter_in_one_line_before_connecting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SAGA_SAGAS", '["sagas"]')
    monkeypatch.setenv("SAGA_DATABASE__URL", "postgresql://saga@127.0.0.1:1/saga")
    refused = {
        "--outcome DONE": "--outcome",
        "--status asleep": "--status",
        "--older-than soon": "--older-than",
        "--after x": "--after",
        "--attr x": "--state-contains",
    }
    for line, option in refused.items():
        assert main(["sagas", "list", *line.split()]) == 2
        [said] = capsys.readouterr().err.strip().splitlines()
        assert f"bad {option}: " in said


class _Queries:
    def __init__(self, pages: list[list[TimelineEntry]]) -> None:
        self.pages = pages
        self.asked: list[int] = []

    def timeline(self, saga_type: str, saga_id: str, after: int = 0) -> list[TimelineEntry]:
        self.asked.append(after)
        return self.pages.pop(0) if self.pages else []


def _entry(id_: int, ended: bool = False) -> TimelineEntry:
    effects: dict[str, Any] = {"ended": True} if ended else {}
    return TimelineEntry(
        id_,
        AT,
        "event",
        f"m{id_}",
        "T",
        "applied",
        id_,
        "t",
        0,
        id_,
        None,
        None,
        None,
        None,
        effects,
    )


def _view(status: str = "active") -> SagaView:
    summary = SagaSummary("order-saga", "o-1", status, "RUNNING", AT, 1, AT, AT, None)
    return SagaView(summary, None, [], [], [], [_entry(1)])


def _follow(
    monkeypatch: pytest.MonkeyPatch, queries: _Queries, seconds: float | None, sleep: Any
) -> int:
    from contextlib import contextmanager

    from processor._cli import commands

    @contextmanager
    def fake(_settings: object) -> Any:
        yield queries

    monkeypatch.setattr(commands, "inspect_queries", fake)
    args = argparse.Namespace(json=False, follow_seconds=seconds)
    clock = iter(float(i) for i in range(1000))
    return follow(args, None, _view(), clock=lambda: next(clock), sleep=sleep)  # type: ignore[arg-type]


def test_follow_prints_new_rows_and_stops_at_the_end(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    queries = _Queries([[], [_entry(2)], [_entry(3, ended=True)]])
    slept: list[float] = []
    assert _follow(monkeypatch, queries, None, slept.append) == 0
    assert queries.asked == [1, 1, 2]
    assert slept == [1.0, 1.0]
    out = capsys.readouterr().out
    assert " m2 " in out
    assert out.rstrip().endswith("saga ended")


def test_follow_stops_after_its_seconds_and_on_ctrl_c(monkeypatch: pytest.MonkeyPatch) -> None:
    queries = _Queries([])
    assert _follow(monkeypatch, queries, 3, lambda _s: None) == 0
    assert len(queries.asked) == 3  # the clock advances a second a reading: 1, 2, 3

    def interrupted(_seconds: float) -> None:
        raise KeyboardInterrupt

    assert _follow(monkeypatch, _Queries([]), None, interrupted) == 0


def test_an_ended_saga_is_not_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    args = argparse.Namespace(json=False, follow_seconds=None)
    assert follow(args, None, _view("ended")) == 0  # type: ignore[arg-type]
