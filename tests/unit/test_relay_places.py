"""The relay's choice of worker over tables distributed by bucket (processor._postgres.places)."""

from __future__ import annotations

from processor._postgres.places import RelayPlaces

A, B = "w1:5432", "w2:5432"
ORDER = [A, B]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_wake_up_no_one_named_looks_at_every_worker_once() -> None:
    places = RelayPlaces(5.0)
    first = places.next(ORDER)
    assert places.done(first, found=True, full=False, order=ORDER)
    second = places.next(ORDER)
    assert {first, second} == {A, B}
    assert not places.done(second, found=False, full=False, order=ORDER)


def test_a_named_worker_is_looked_at_alone_and_a_full_round_goes_on() -> None:
    places = RelayPlaces(5.0)
    for place in (places.next(ORDER), places.next(ORDER)):
        places.done(place, found=False, full=False, order=ORDER)
    places.expect([B])
    assert places.next(ORDER) == B
    assert places.done(B, found=True, full=True, order=ORDER)  # more of B's rows may wait
    assert places.next(ORDER) == B
    assert not places.done(B, found=True, full=False, order=ORDER)
    places.expect([A, B])
    assert places.done(places.next(ORDER), found=True, full=False, order=ORDER)
    assert not places.done(places.next(ORDER), found=False, full=False, order=ORDER)


def test_a_resting_worker_is_passed_over_without_a_loop_and_looked_at_after_its_rest() -> None:
    clock = Clock()
    places = RelayPlaces(5.0, clock)
    places.expect([A, B])
    first = places.next(ORDER)
    places.failed(first)
    other = places.next(ORDER)
    assert other != first
    # The failed worker's rows are still pending, but it rests: no round at once (a loop
    # over the answering worker while the other is away), the relay waits for a wake-up.
    assert not places.done(other, found=True, full=False, order=ORDER)
    assert places.next(ORDER) == other  # woken meanwhile: the answering worker
    places.done(other, found=False, full=False, order=ORDER)
    clock.now += 5.0
    assert places.next(ORDER) == first  # its rest is over, its rows still pending
    assert not places.done(first, found=True, full=False, order=ORDER)


def test_every_worker_resting_still_gives_a_turn() -> None:
    clock = Clock()
    places = RelayPlaces(5.0, clock)
    for _ in range(2):
        places.failed(places.next(ORDER))
    assert places.next(ORDER) in ORDER
