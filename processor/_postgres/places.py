"""Which worker the relay looks at next, with the tables distributed by bucket.

A relay round over tables by bucket claims one worker's rows (a claim deleting rows on two
workers would commit in two phases over both). :class:`RelayPlaces` chooses the worker: one it
was told has new rows (:meth:`RelayPlaces.expect`: a committed batch names its partitions), else,
after a wake-up no one named, every worker in turn. A worker whose round failed rests for a
while, and the others go on meanwhile. Pure: the store (:mod:`processor._postgres.outbox`) maps
partitions to workers and runs the rounds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

__all__ = ["RelayPlaces"]


class RelayPlaces:
    """The relay's choice of worker, round after round.

    Args:
        rest_s: How long a worker whose round failed is passed over while others answer.
        clock: Seconds, monotonic.
    """

    def __init__(self, rest_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._rest_s = rest_s
        self._clock = clock
        # Workers whose rows are to be looked at: told of by expect(), or every one after a
        # wake-up no one named. Written by the committing threads as well (whole operations).
        self._pending: set[str] = set()
        self._anywhere = True
        self._resting: dict[str, float] = {}
        self._turn = 0

    def expect(self, places: Collection[str] | None) -> None:
        """Rows were committed on ``places`` (None: anywhere, or not known)."""
        if places is None:
            self._anywhere = True
        else:
            self._pending.update(places)

    def next(self, order: Sequence[str]) -> str:
        """The worker to look at now, of ``order`` (every worker, sorted; two or more).

        A worker told of and not resting first; with none, every worker is pending again (a
        wake-up whose rows no one named) and the turn goes round them.
        """
        if self._anywhere:
            self._anywhere = False
            self._pending.update(order)
        ready = self._ready(order) or list(order)
        turn = [p for p in ready if p in self._pending]
        if not turn:
            self._pending.update(order)
            turn = ready
        place = turn[self._turn % len(turn)]
        self._turn += 1
        return place

    def failed(self, place: str) -> None:
        """``place``'s round failed: it rests while others answer; its rows stay pending."""
        self._resting[place] = self._clock() + self._rest_s

    def done(self, place: str, *, found: bool, full: bool, order: Sequence[str]) -> bool:
        """``place``'s round ended; returns whether another round should follow at once.

        A worker looked at is done with unless its round was full. The relay goes on while a
        worker it was told of, and that is not resting, is not looked at yet; a resting worker
        is looked at after a wake-up once its rest is over, never in a loop meanwhile.
        """
        self._resting.pop(place, None)
        if found and full:
            self._pending.add(place)
        else:
            self._pending.discard(place)
        if self._anywhere:
            return True
        return any(p in self._pending for p in self._ready(order))

    def _ready(self, order: Sequence[str]) -> list[str]:
        now = self._clock()
        return [p for p in order if self._resting.get(p, 0.0) <= now]
