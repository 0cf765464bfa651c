"""What a saga function's cache miss costs: one handler step, replayed against a journal of K.

In process, no Kafka or PostgreSQL. A saga function awaits calls in a row, each with a timeout
and an undo (as the trip's do). Its state is driven to the place where K-1 awaits are resolved
and the K-th is pending; the measured step is the reply that resolves the K-th: the function
runs on to await K+1 (issues its command, schedules its timer), through the bound saga's
``handle_event`` as the engine calls it (working copy of the state, handler, re-validation).

- ``replay``: bound with ``saga_functions.cache_size = 0``, so the function is run from its
  start against the journal of K entries (each entry checked against what the function asks,
  its reply validated back into its class) before it reaches await K+1.
- ``resume``: bound with the cache; before each timed step (untimed) the previous await's reply
  is delivered, which leaves the function suspended in the cache at exactly this place, so the
  timed step resumes it there.

Both are CPU time of the calling thread, with the garbage collector off while timed (as
``timeit``). ``miss`` is their difference: what a cache miss adds to the step, ``per_await``
that spread over the journal's entries. Beside them, what a journal of K costs every handler run
of the engine whatever the cache: the row's JSON loaded into the state class (``load``) and
dumped again (``dump``), and its size.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from processor import Message, SagaContext, Undo, message_type, saga_function
from processor._authoring.functions import CACHE_SIZE, FunctionState, function_spec
from processor._authoring.messages import MessageMetadata, registry
from processor._invocation import BoundSaga, bind
from processor._invocation.inputs import EventInput

__all__ = ["DEPTHS", "Begin", "StepDone", "bench_steps", "measure", "measure_all"]

DEPTHS = (10, 50)
# Never published: these messages live only in this process.
TOPIC = "bench-fn-replay"
SAGA_ID = "bench-run"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@message_type("bench.fnreplay.Begin", topic=TOPIC)
class Begin(Message):
    """Starts the bench saga function: ``steps`` calls in a row."""

    run_id: str
    steps: int


@message_type("bench.fnreplay.DoStep", topic=TOPIC)
class DoStep(Message):
    run_id: str
    n: int


@message_type("bench.fnreplay.StepDone", topic=TOPIC)
class StepDone(Message):
    run_id: str
    n: int


@message_type("bench.fnreplay.UndoStep", topic=TOPIC)
class UndoStep(Message):
    run_id: str
    n: int


@message_type("bench.fnreplay.StepUndone", topic=TOPIC)
class StepUndone(Message):
    run_id: str
    n: int


@saga_function(type="bench-fn-steps", association_property="run_id")
async def bench_steps(saga: SagaContext, begin: Begin) -> None:
    """``begin.steps`` calls in a row, each with a timeout and an undo, like the trip's."""
    for n in range(begin.steps):
        await saga.call(
            DoStep(run_id=begin.run_id, n=n),
            expects=StepDone,
            timeout=timedelta(minutes=5),
            undo=Undo(UndoStep(run_id=begin.run_id, n=n), expects=StepUndone),
        )


@dataclass(frozen=True)
class _Driver:
    """Delivers events to one bound saga as the engine's handler run would, at a fixed clock."""

    bound: BoundSaga

    def deliver(self, state: FunctionState | None, event: Message) -> FunctionState:
        meta = MessageMetadata(
            message_id=f"m-{id(event)}",
            message_type=registry.of(type(event)).name,
            correlation_id=None,
            causation_id=None,
            occurred_at=None,
            topic=TOPIC,
            partition=0,
            offset=0,
            key=SAGA_ID,
        )
        out = self.bound.handle_event(state, SAGA_ID, EventInput(event, meta), NOW)
        assert isinstance(out.state, FunctionState)
        return out.state


def _states(driver: _Driver, depth: int) -> list[FunctionState]:
    """The states after the start and after each reply: ``states[k]`` has k entries."""
    state = driver.deliver(None, Begin(run_id=SAGA_ID, steps=depth + 1))
    states = [state]
    for n in range(depth):
        state = driver.deliver(state, StepDone(run_id=SAGA_ID, n=n))
        states.append(state)
    return states


def _timed(
    iterations: int, step: Callable[[], Any], setup: Callable[[], Any] | None = None
) -> float:
    """Mean CPU seconds of ``step``; ``setup`` runs before each, untimed."""
    spent = 0.0
    was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(iterations):
            if setup is not None:
                setup()
            t0 = time.thread_time()
            step()
            spent += time.thread_time() - t0
    finally:
        if was:
            gc.enable()
    return spent / iterations


def measure(depth: int, *, iterations: int, repeats: int) -> dict[str, Any]:
    """The step resolving await ``depth``, replayed and resumed; microseconds (see the module)."""
    if depth < 2:
        raise ValueError("depth: at least 2 (the resumed step needs the await before it)")
    spec = function_spec(bench_steps)
    assert spec is not None
    cache = spec.suspended
    replaying = _Driver(bind(bench_steps, settings={CACHE_SIZE: 0}))
    resuming = _Driver(bind(bench_steps))
    states = _states(replaying, depth)
    # ``before``: await ``depth`` pending (depth-1 entries); the reply resolves it.
    earlier, before = states[depth - 2], states[depth - 1]
    reply = StepDone(run_id=SAGA_ID, n=depth - 1)
    previous = StepDone(run_id=SAGA_ID, n=depth - 2)
    after = replaying.deliver(before, reply)
    assert len(after.journal) == depth
    assert after.pending is not None
    assert after.pending.seq == depth

    held: list[FunctionState] = []

    def suspend_here() -> None:
        # Forget what the last step left in the cache (dropping it here, not in the timed
        # step), then leave the function suspended at ``before``'s place.
        cache.drop(SAGA_ID)
        held[:] = [resuming.deliver(earlier, previous)]

    def replay() -> None:
        replaying.deliver(before, reply)

    def resume() -> None:
        resuming.deliver(held[0], reply)

    hits = cache.hits
    replays, resumes = [], []
    for _ in range(repeats):
        gc.collect()
        replays.append(_timed(iterations, replay))
        gc.collect()
        resumes.append(_timed(iterations, resume, suspend_here))
    resumed = cache.hits - hits
    cache.drop(SAGA_ID)
    if resumed != repeats * iterations:
        raise RuntimeError(f"the resumed steps hit the cache {resumed} times, not {iterations}")

    row = replaying.bound.state_to_json(after)
    load = statistics.median(
        _timed(iterations, lambda: replaying.bound.state_from_json(row)) for _ in range(repeats)
    )
    dump = statistics.median(
        _timed(iterations, lambda: replaying.bound.state_to_json(after)) for _ in range(repeats)
    )
    replay_us = statistics.median(replays) * 1e6
    resume_us = statistics.median(resumes) * 1e6
    return {
        "awaits": depth,
        "iterations": iterations,
        "repeats": repeats,
        "replay_us": replay_us,
        "replay_per_await_us": replay_us / depth,
        "resume_us": resume_us,
        "miss_us": replay_us - resume_us,
        "miss_per_await_us": (replay_us - resume_us) / depth,
        "replay_rounds_us": [v * 1e6 for v in replays],
        "resume_rounds_us": [v * 1e6 for v in resumes],
        "state_bytes": len(json.dumps(row, separators=(",", ":"))),
        "load_us": load * 1e6,
        "dump_us": dump * 1e6,
    }


def measure_all(
    depths: Sequence[int] = DEPTHS, *, quick: bool = False, iterations: int | None = None
) -> dict[str, dict[str, Any]]:
    """``measure`` for each depth, by depth; about as many awaits replayed at each."""
    out: dict[str, dict[str, Any]] = {}
    for depth in depths:
        n = iterations or max(5, (500 if quick else 3000) // depth)
        out[str(depth)] = measure(depth, iterations=n, repeats=3 if quick else 5)
    return out
