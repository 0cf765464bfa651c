"""S10's pure parts: the shared saga's decision, the latency figures, and the verdicts (a peer
that could not run is reported with its reason, never as a zero)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import s10_engines, temporal_server
from benchmarks.s10_saga import credit_refused, half_rate, latency_summary, transfer_ids


def test_the_refused_credits_are_a_stable_tenth() -> None:
    ids = transfer_ids("unit", 20_000)
    refused = [t for t in ids if credit_refused(t)]
    assert 0.09 < len(refused) / len(ids) < 0.11
    # A retried step decides as the first try did, in any process.
    assert refused == [t for t in ids if credit_refused(t)]
    assert not any(credit_refused(t, share=0.0) for t in ids[:100])


def test_latency_summary_is_in_milliseconds_by_nearest_rank() -> None:
    got = latency_summary([i / 1000 for i in range(1, 101)])
    assert got == {"p50_ms": 50.0, "p99_ms": 99.0, "max_ms": 100.0, "sagas": 100.0}


def test_half_rate_never_drops_below_the_floor() -> None:
    assert half_rate(3000.0) == 1500.0
    assert half_rate(1.2) == 1.0


def _side(rate: float, box_us: float) -> dict[str, Any]:
    return {
        "saturation": {
            "sagas": 100,
            "sagas_per_s": rate,
            "box_us": box_us,
            "cpu_s": {"worker": box_us * 1e-4},
        },
        "latency": {"rate": rate / 2, "p50_ms": 10.0, "p99_ms": 20.0},
    }


def test_verdicts_against_each_peer_and_a_skipped_one() -> None:
    sides = {
        "engine": _side(3000.0, 400.0),
        "dbos": _side(90.0, 14_000.0),
        "temporal": {"skipped": "no `go` on PATH"},
    }
    goals = s10_engines.compare(sides)
    assert goals["dbos"]["rate_ratio"]["passed"]  # 33x
    assert goals["dbos"]["cpu_ratio"]["passed"]  # 1/35 of the peer's
    assert goals["dbos"]["cpu_ratio"]["value"] == pytest.approx(400 / 14_000)
    assert goals["temporal"] == {"skipped": "no `go` on PATH"}
    rows = s10_engines.summary({"sides": sides, "goals": goals})
    text = "\n".join(" | ".join(r) for r in rows)
    assert "Temporal | skipped: no `go` on PATH" in text
    assert "engine / Temporal | no ratio: the peer was skipped" in text
    assert "engine / DBOS Transact sagas/s | 33.3 (goal >= 30: PASS)" in text


def test_a_missing_ratio_goal_reads_below() -> None:
    goals = s10_engines.compare({"engine": _side(100.0, 9000.0), "dbos": _side(90.0, 14_000.0)})
    assert not goals["dbos"]["rate_ratio"]["passed"]
    assert not goals["dbos"]["cpu_ratio"]["passed"]
    assert goals["temporal"] == {"skipped": "not run"}
    assert any("BELOW" in line for line in s10_engines.goal_lines(goals))


def test_without_a_binary_or_go_the_temporal_peer_is_unavailable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(temporal_server.ENV, raising=False)
    monkeypatch.setattr(temporal_server, "CACHE", tmp_path / "none")
    monkeypatch.setattr("shutil.which", lambda _name: None)
    with pytest.raises(temporal_server.Unavailable, match="no `go` on PATH"):
        temporal_server.binary()


def test_a_named_binary_that_is_missing_is_said_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(temporal_server.ENV, str(tmp_path / "temporal"))
    with pytest.raises(temporal_server.Unavailable, match="is not a file"):
        temporal_server.binary()
