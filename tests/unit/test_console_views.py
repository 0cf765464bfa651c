"""The console's pure pieces: the state-machine drawing and the JSON form of the views."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from processor.ops.diagram import svg
from processor.ports.views import TimelineEntry, consumer_lag, jsonable, payload_text
from sagas.order import OrderSaga


def test_the_drawing_highlights_only_the_current_state() -> None:
    drawing = svg(OrderSaga.machine_spec(), "WAITING")
    assert drawing.count('class="state current') == 1
    assert 'class="state current" data-state="WAITING"' in drawing
    for state in ("NEW", "RUNNING", "COMPENSATING", "COMPLETED", "FAILED", "TIMED_OUT"):
        assert f'data-state="{state}"' in drawing
    assert "current" not in svg(OrderSaga.machine_spec(), None).replace("currentColor", "")


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
