"""A retry loop's warning during an outage: the first, then one per interval, then the end."""

from __future__ import annotations

import logging

import pytest

from processor._observe.repeats import RepeatedWarning


def test_repeats_are_held_back_then_summarised_and_the_recovery_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="test.repeats")
    now = [100.0]
    warn = RepeatedWarning(logging.getLogger("test.repeats"), "poller", 30.0, lambda: now[0])
    for _ in range(60):  # a failure a second for a minute
        warn.failed("poller retrying after: %s", "connection refused")
        now[0] += 1.0
    warn.succeeded()
    warn.succeeded()  # nothing to say twice
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "poller retrying after: connection refused",
        "poller retrying after: connection refused (29 more like it since 30 s ago)",
        "poller recovered after 60 failure(s) over 60 s",
    ]
    # A new outage starts a new run: its first failure is said at once.
    warn.failed("poller retrying after: %s", "timeout")
    assert caplog.records[-1].getMessage() == "poller retrying after: timeout"
