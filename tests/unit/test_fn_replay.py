"""S11's in-process parts (benchmarks/fn_replay.py, benchmarks/s11_functions.py) at tiny sizes,
so that the replay micro-benchmark and the backlog's order keep working as the engine changes."""

from __future__ import annotations

import pytest

from benchmarks import fn_replay
from benchmarks.s11_functions import REPLIES, backlog, summary
from processor._authoring.functions import function_spec
from schemas import trips


@pytest.mark.parametrize("depth", [2, 4])
def test_the_replayed_and_the_resumed_step_are_measured(depth: int) -> None:
    spec = function_spec(fn_replay.bench_steps)
    assert spec is not None
    hits = spec.suspended.hits
    got = fn_replay.measure(depth, iterations=2, repeats=1)
    assert got["awaits"] == depth
    for key in ("replay_us", "resume_us", "load_us", "dump_us"):
        assert got[key] > 0
    assert got["replay_per_await_us"] == pytest.approx(got["replay_us"] / depth)
    assert got["miss_us"] == pytest.approx(got["replay_us"] - got["resume_us"])
    assert got["state_bytes"] > 0
    # Every resumed step was a cache hit, and the measurement leaves nothing in the cache.
    assert spec.suspended.hits - hits == 2
    assert len(spec.suspended) == 0


def test_a_depth_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="depth"):
        fn_replay.measure(1, iterations=1, repeats=1)


def test_measure_all_reports_by_depth() -> None:
    got = fn_replay.measure_all((2, 3), quick=True, iterations=1)
    assert list(got) == ["2", "3"]
    assert got["3"]["awaits"] == 3


def test_the_backlog_comes_in_waves_each_trip_in_its_order() -> None:
    messages = backlog(trips.TripRequested, "r", 3)
    assert len(messages) == 3 * 4
    assert [type(m) for m in messages[:3]] == [trips.TripRequested] * 3
    for wave, reply in enumerate(REPLIES, start=1):
        assert [type(m) for m in messages[3 * wave : 3 * wave + 3]] == [reply] * 3
    for trip_id in {getattr(m, "trip_id") for m in messages}:  # noqa: B009
        kinds = [type(m) for m in messages if getattr(m, "trip_id") == trip_id]  # noqa: B009
        assert kinds == [trips.TripRequested, *REPLIES]


def test_the_summary_reads_a_result() -> None:
    side = {"events_per_s": 1000.0, "cpu_us": 100.0, "state_bytes": 800.0}
    result = {
        "median": {"orchestrated": side, "function": {**side, "events_per_s": 800.0}},
        "goal": {"at_least": 0.7, "median": 0.8, "passed": True, "rounds": [0.8]},
        "cache": {"hits": 3, "replays": 0, "resolutions": 3},
        "replay_always": {"events_per_s": 700.0, "cache_replays": 3},
        "replay_cost": fn_replay.measure_all((2,), iterations=1),
    }
    rows = summary(result)
    assert any("PASS" in value for _, _, value in rows)
    assert any(measure == "handler step at 2 awaits" for _, measure, _ in rows)
