"""What the metrics read of the saga functions a processor runs: resumes, replays, held."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from processor._authoring.functions import function_spec
from processor._invocation import BoundSaga

__all__ = ["function_tallies"]


def function_tallies(
    sagas: Mapping[str, BoundSaga],
) -> Callable[[], dict[str, tuple[int, int, int]]]:
    """A reader of (resumed, replayed, held suspended) per saga function type, for a scrape."""
    specs = {
        name: spec
        for name, bound in sagas.items()
        if (spec := function_spec(bound.definition.state_cls)) is not None
    }

    def read() -> dict[str, tuple[int, int, int]]:
        return {
            name: (s.suspended.hits, s.suspended.replays, len(s.suspended))
            for name, s in specs.items()
        }

    return read
