"""Planning on top of a batch that is still committing sees exactly what that batch will leave."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from processor._engine.overlay import overlay
from processor._engine.rows import (
    DeadlineInsert,
    DeadlineRef,
    HistoryRow,
    Loaded,
    Outcome,
    SagaRow,
    SagaStatus,
    SagaWrite,
    WriteSet,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _ref(name: str, saga: str = "s1") -> DeadlineRef:
    return DeadlineRef("t", saga, name, NOW, None, 7)


def _loaded(**kw: object) -> Loaded:
    base: dict[str, object] = {
        "sagas": {},
        "applied": set(),
        "deadlines": {},
        "lease_token": 7,
        "now": NOW,
    }
    base.update(kw)
    return Loaded(**base)  # type: ignore[arg-type]


def test_rows_written_by_the_prior_batch_replace_the_stored_ones() -> None:
    stored = {("t", "s1"): SagaRow("t", "s1", {"n": 1}, SagaStatus.ACTIVE, 1)}
    prior = WriteSet(sagas=[SagaWrite("t", "s1", {"n": 2}, SagaStatus.ENDED, 2, 1, None)])
    row = overlay(_loaded(sagas=stored), prior).sagas[("t", "s1")]
    assert (row.state, row.status, row.version) == ({"n": 2}, "ended", 2)


def test_a_saga_created_by_the_prior_batch_is_visible_with_its_version() -> None:
    prior = WriteSet(sagas=[SagaWrite("t", "new", {"n": 1}, SagaStatus.ACTIVE, 1, None, None)])
    assert overlay(_loaded(), prior).sagas[("t", "new")].version == 1


def test_messages_applied_by_the_prior_batch_count_as_applied_but_skipped_ones_do_not() -> None:
    prior = WriteSet(
        history=[
            HistoryRow("t", "s1", "m1", "x", "event", Outcome.APPLIED, 1, "in", 0, 1),
            HistoryRow("t", "s1", "m2", "x", "event", Outcome.DUPLICATE, None, "in", 0, 2),
        ]
    )
    applied = overlay(_loaded(), prior).applied
    assert ("t", "s1", "m1") in applied
    assert ("t", "s1", "m2") not in applied


def test_deadlines_the_prior_batch_deleted_or_cleared_are_gone() -> None:
    kept, cancelled, cleared = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    loaded = _loaded(
        deadlines={kept: _ref("keep"), cancelled: _ref("cancel"), cleared: _ref("x", "s2")}
    )
    prior = WriteSet(deadline_deletes=[("t", "s1", "cancel")], deadline_clears=[("t", "s2")])
    assert set(overlay(loaded, prior).deadlines) == {kept}


def test_a_deadline_the_prior_batch_inserted_survives_even_if_that_batch_committed_already() -> (
    None
):
    # A schedule is delete-then-insert of the name; when the prior batch has committed, the
    # stored row for that name is its new one, and a fired record for it must not look stale.
    new_id = uuid.uuid4()
    loaded = _loaded(deadlines={str(new_id): _ref("timeout")})
    prior = WriteSet(
        deadline_deletes=[("t", "s1", "timeout")],
        deadline_inserts=[DeadlineInsert(new_id.hex, "t", "s1", "timeout", NOW, None, "in", 0)],
    )
    assert set(overlay(loaded, prior).deadlines) == {str(new_id)}


def test_lease_token_and_clock_are_the_fresh_reads() -> None:
    out = overlay(_loaded(lease_token=9), WriteSet())
    assert (out.lease_token, out.now) == (9, NOW)
