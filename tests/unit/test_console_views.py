"""The console's pure pieces: the state-machine drawing and the JSON form of the views."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

from processor._ports.views import TimelineEntry, consumer_lag, jsonable, payload_text
from processor.ops._diagram import svg
from sagas.order import OrderSaga


def test_the_drawing_highlights_only_the_current_state() -> None:
    drawing = svg(OrderSaga.machine_spec(), "WAITING")
    assert drawing.count('class="state current') == 1
    assert 'class="state current" data-state="WAITING"' in drawing
    for state in ("NEW", "RUNNING", "COMPENSATING", "COMPLETED", "FAILED", "TIMED_OUT"):
        assert f'data-state="{state}"' in drawing
    assert "current" not in svg(OrderSaga.machine_spec(), None).replace("currentColor", "")


def test_the_drawing_chains_the_undos_last_step_first_and_highlights_the_one_running() -> None:
    drawing = svg(OrderSaga.machine_spec(), "COMPENSATING", "RESERVING_UNDO")
    undos = re.findall(r'data-substate="([A-Z_]+)" data-in="COMPENSATING"', drawing)
    assert undos == ["CHARGING_UNDO", "RESERVING_UNDO"]
    # Drawn left to right in that order, an arrow between them.
    xs = [int(x) for x in re.findall(r'data-in="COMPENSATING"><rect x="(\d+)"', drawing)]
    assert len(xs) == 2
    assert xs == sorted(xs)
    assert drawing.count('class="substate current-substate"') == 1
    assert 'current-substate" data-substate="RESERVING_UNDO"' in drawing
    # The canonical states are unchanged: one current, the substates are not among them.
    assert drawing.count('class="state current') == 1
    assert 'data-state="COMPENSATED"' in drawing
    # A substate of another state than the current one is not highlighted.
    assert "current-substate" not in svg(OrderSaga.machine_spec(), "WAITING", "RESERVING_UNDO")


def test_views_turn_into_plain_json() -> None:
    at = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
    entry = TimelineEntry(
        1, at, "event", "m-1", "T", "applied", 1, "t", 0, 7, None, {"a": "b"}, "{}", None, None
    )
    data = jsonable({"entry": entry, "age": timedelta(seconds=90), "raw": b"\xff"})
    assert json.loads(json.dumps(data))["entry"]["at"] == at.isoformat()
    assert data["age"] == 90.0
    assert data["raw"] == payload_text(b"\xff") == "base64:/w=="


def test_consumer_lag_counts_from_the_stored_position_or_the_low_watermark() -> None:
    stored: dict[tuple[str, int], int | None] = {("a", 0): 40, ("a", 1): None, ("b", 0): 9}
    marks = {("a", 0): (0, 50), ("a", 1): (5, 12), ("b", 0): (0, 9), ("gone", 0): (0, 99)}
    lag = consumer_lag({**stored, ("unreported", 0): 3}, marks)
    assert [(p.topic, p.partition, p.lag) for p in lag.partitions] == [
        ("a", 0, 10),
        ("a", 1, 7),
        ("b", 0, 0),
    ]
    assert lag.total == 17
    # A position past the watermark (a truncated topic) is no negative lag.
    assert consumer_lag({("a", 0): 60}, marks).total == 0
