"""The console's pure pieces: the state-machine drawing and the JSON form of the views."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from processor.ops.diagram import svg
from processor.ops.views import TimelineEntry, jsonable, payload_text
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
