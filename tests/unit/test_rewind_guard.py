"""A participant's rewind never lets a later command through before the one it stopped on."""

from __future__ import annotations

from processor._authoring.participant.rewind import GIVE_UP_AFTER, RewindGuard
from processor._engine.records import Record

TP = ("commands", 0)
OTHER = ("commands", 1)


def rec(offset: int, tp: tuple[str, int] = TP) -> Record:
    return Record(tp[0], tp[1], offset, b"k", b"v", ())


def make() -> tuple[RewindGuard, list[tuple[tuple[str, int], int]]]:
    seeks: list[tuple[tuple[str, int], int]] = []
    return RewindGuard(lambda tp, offset: seeks.append((tp, offset))), seeks


def test_records_pass_untouched_without_a_rewind() -> None:
    guard, seeks = make()
    assert guard.admit([rec(5), rec(6)]) == [rec(5), rec(6)]
    assert seeks == []


def test_a_rewind_that_took_resumes_at_its_point() -> None:
    guard, seeks = make()
    guard.rewind({TP: 7})
    assert seeks == [(TP, 7)]
    assert guard.admit([rec(7), rec(8)]) == [rec(7), rec(8)]
    assert guard.pending == {}


def test_a_rewind_that_did_not_take_drops_later_records_and_seeks_again() -> None:
    guard, seeks = make()
    guard.rewind({TP: 7})
    got = guard.admit([rec(9, OTHER), rec(8), rec(9)])
    assert got == [rec(9, OTHER)]  # other partitions go on
    assert seeks == [(TP, 7), (TP, 7)]
    assert guard.pending == {TP: 7}
    assert guard.admit([rec(7), rec(8)]) == [rec(7), rec(8)]
    assert guard.pending == {}


def test_a_reassigned_partition_takes_its_position_from_the_database() -> None:
    guard, _ = make()
    guard.rewind({TP: 7})
    guard.forget([TP])
    assert guard.admit([rec(12)]) == [rec(12)]


def test_a_rewind_point_that_never_comes_back_is_given_up_without_losing_what_followed() -> None:
    guard, seeks = make()
    guard.rewind({TP: 7})
    for _ in range(GIVE_UP_AFTER):
        assert guard.admit([rec(30)]) == []
    seeks.clear()
    assert guard.admit([rec(30)]) == []
    assert seeks == [(TP, 30)]  # the dropped record is read again
    assert guard.admit([rec(30), rec(31)]) == [rec(30), rec(31)]
