"""When a batch wakes the deadline poller: only for what its next planned look would miss."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from processor._engine.rows import DeadlineInsert, WriteSet

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SOON = NOW + timedelta(seconds=30)


def _insert(due: datetime, saga_id: str = "s1") -> DeadlineInsert:
    return DeadlineInsert(f"{saga_id}-id", "t", saga_id, "timeout", due, None, "in", 0)


def test_new_deadlines_wake_it_only_when_one_is_due_before_its_next_look() -> None:
    far = WriteSet(deadline_inserts=[_insert(NOW + timedelta(minutes=30))])
    assert not far.wakes_poller(SOON)
    mixed = WriteSet(deadline_inserts=[_insert(NOW + timedelta(minutes=30)), _insert(SOON, "s2")])
    assert mixed.wakes_poller(SOON)
    # Without a bound, as for writers that do not know the poller's interval: any deadline.
    assert far.wakes_poller(None)
    assert not WriteSet().wakes_poller(None)


def test_resets_and_operator_requests_always_wake_it() -> None:
    assert WriteSet(deadline_resets=[("d1", 3)]).wakes_poller(SOON)
    assert WriteSet(wake_deadlines=True).wakes_poller(SOON)
