"""The cache of suspended saga functions (functions.turn.Suspended): one a saga, at its place."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, cast

import pytest

from processor import SagaError
from processor._authoring.functions import FunctionState, function_spec
from processor._authoring.functions.context import SagaContext
from processor._authoring.functions.turn import Suspended, Turn
from processor.testing import SagaFixture
from sagas.trip_function import trip_function
from schemas import trips

CTX = cast(SagaContext, object())


def test_a_function_is_resumed_only_at_its_place_and_with_its_dependencies() -> None:
    cache = Suspended()
    coro: Any = object()
    cache.put("s-1", "c1", coro, CTX, (1,), size=10)
    assert cache.take("s-1", "c1", (1,)) == (coro, CTX)
    assert cache.take("s-1", "c1", (1,)) is None
    cache.put("s-1", "c2", coro, CTX, (1,), size=10)
    assert cache.take("s-1", "c2", (2,)) is None
    assert (cache.hits, cache.replays) == (1, 2)


def test_a_saga_keeps_its_newest_place_and_a_miss_forgets_an_older_one() -> None:
    cache = Suspended()
    cache.put("s-1", "c1", "old", CTX, (), size=10)
    cache.put("s-1", "c2", "new", CTX, (), size=10)
    assert len(cache) == 1
    assert cache.take("s-1", "c1", ()) is None
    assert len(cache) == 0


def test_an_ended_saga_is_forgotten_and_the_oldest_go_past_the_size() -> None:
    cache = Suspended()
    for n in range(5):
        cache.put(f"s-{n}", "c", n, CTX, (), size=3)
    assert len(cache) == 3
    assert cache.take("s-0", "c", ()) is None
    cache.drop("s-4")
    assert len(cache) == 2
    assert cache.take("s-3", "c", ()) == (3, CTX)
    cache.put("s-9", "c", 9, CTX, (), size=0)
    assert len(cache) == 1


def test_a_held_function_keeps_no_handler_run_and_refuses_operations() -> None:
    spec = function_spec(trip_function)
    assert spec is not None
    fx = SagaFixture(trip_function)
    fx.when(
        trips.TripRequested(
            trip_id="t-held", traveller_id="a", flight="F1", hotel="H1", amount=Decimal("10")
        )
    )
    state = fx.state
    assert isinstance(state, FunctionState)
    held = spec.suspended.take("t-held", state.chain, ())
    assert held is not None
    coro, ctx = held
    try:
        assert not isinstance(ctx._turn, Turn)
        with pytest.raises(SagaError, match="outside its handler run"):
            ctx.send(trips.CancelFlight(trip_id="t-held", flight="F1"))
    finally:
        coro.close()
