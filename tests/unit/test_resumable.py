"""Which parked sagas a replica resumes by itself: those parked on a version it now knows."""

from __future__ import annotations

from processor._authoring.upcasting import MissingUpcaster
from processor._runtime.resume import resumable


def test_an_event_too_new_for_older_code_is_retried() -> None:
    reason = "'t.Noted' schema-version 2 is newer than this code knows (v1): deploy it first"
    assert resumable(reason, "journal", {"journal": 1})


def test_a_stored_state_too_new_is_resumed_only_by_code_that_knows_its_version() -> None:
    reason = str(MissingUpcaster("account", stored=2, current=1, missing=None))
    assert resumable(reason, "account", {"account": 2})
    assert resumable(reason, "account", {"account": 3})
    assert not resumable(reason, "account", {"account": 1})
    assert not resumable(reason, "other", {"account": 2})


def test_other_reasons_wait_for_an_operator() -> None:
    assert not resumable(None, "account", {"account": 2})
    assert not resumable("handler 'opened' raised ValueError: bad", "account", {"account": 2})
    missing_chain = str(MissingUpcaster("account", stored=1, current=3, missing=2))
    assert not resumable(missing_chain, "account", {"account": 3})
