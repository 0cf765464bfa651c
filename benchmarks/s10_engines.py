"""S10, the same saga on three engines: this one, Temporal and DBOS Transact, in one run.

The saga is a transfer (:mod:`benchmarks.s10_saga`): debit, credit, and the debit reversed when
the credit is refused (one in ten, the same ones on every engine). Each engine runs it as its
users would: here the transfer saga with its participant answering over Kafka
(:mod:`benchmarks.s10_ours`), on Temporal a workflow of three activities on the CLI's dev
server (:mod:`benchmarks.peer_temporal`), on DBOS a workflow of three steps on the same
PostgreSQL (:mod:`benchmarks.peer_dbos`). The steps' own work is the same trivial decision
everywhere, so what is measured is what each engine costs around it.

For each engine, one after the other on the same machine and services:

- sagas per second at saturation: a backlog of N sagas started at once, timed until the last
  one ended (N sized so that each side takes some 10-30 s);
- p50 / p99 start-to-end latency at half of its own saturation rate;
- whole-box CPU per saga over the saturation window: every process that does the engine's
  work (for this engine the processor, the participant, PostgreSQL and Kafka; for Temporal its
  server and the worker process; for DBOS its application process and PostgreSQL).

Issue 51's goals: this engine's sagas/s at least 30 times each peer's, and its CPU per saga at
most a thirtieth of each peer's. A peer that cannot run here (no bench virtualenv; for
Temporal, no binary and no Go to build one) is reported as skipped with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks import peer_dbos, peer_temporal, s10_ours
from benchmarks.boxcpu import Meter
from benchmarks.common import Scratch, Services, say

RATE_GOAL = 30.0
CPU_GOAL = 1 / 30
PEERS = ("dbos", "temporal")
NAMES = {"engine": "this engine", "dbos": "DBOS Transact", "temporal": "Temporal"}


@dataclass(frozen=True)
class Options:
    """Backlog sizes per side (each side runs at its own pace) and the latency phase's length.

    Each side's backlog takes it some seconds at its own rate (the engine's 15,000 about eight
    here), so that its start (joining groups, the first batches) is a small part of the time.
    """

    engine_sagas: int = 15_000
    dbos_sagas: int = 1_500
    temporal_sagas: int = 300
    latency_seconds: float = 10.0
    deadline: float = 300.0

    @classmethod
    def of(
        cls,
        *,
        quick: bool,
        sagas: int | None = None,
        dbos_sagas: int | None = None,
        temporal_sagas: int | None = None,
    ) -> Options:
        base = cls(1_000, 300, 60, 4.0, 120.0) if quick else cls()
        return cls(
            engine_sagas=sagas or base.engine_sagas,
            dbos_sagas=dbos_sagas or base.dbos_sagas,
            temporal_sagas=temporal_sagas or base.temporal_sagas,
            latency_seconds=base.latency_seconds,
            deadline=base.deadline,
        )


def run(found: Services, box: Scratch, options: Options) -> dict[str, Any]:
    say(
        f"S10 the same saga on three engines: backlogs of {options.engine_sagas} (engine), "
        f"{options.dbos_sagas} (DBOS), {options.temporal_sagas} (Temporal) transfers, then "
        f"{options.latency_seconds:.0f} s at half of each one's rate"
    )
    meter = Meter.find(found.kafka, found.database_url)
    sides: dict[str, dict[str, Any]] = {}
    say("engine: transfer saga, participant kit answering")
    sides["engine"] = s10_ours.measure(
        found, box, meter, options.engine_sagas, options.latency_seconds, options.deadline
    )
    say("DBOS Transact: workflow of three steps on the same PostgreSQL")
    sides["dbos"] = _peer(
        "DBOS",
        lambda: peer_dbos.measure(
            box, meter, options.dbos_sagas, options.latency_seconds, options.deadline
        ),
    )
    box.settle()
    say("Temporal: workflow of three activities on the dev server")
    sides["temporal"] = _peer(
        "Temporal",
        lambda: peer_temporal.measure(
            options.temporal_sagas, options.latency_seconds, options.deadline
        ),
    )
    goals = compare(sides)
    for line in goal_lines(goals):
        say(line)
    return {"sides": sides, "goals": goals, "box_meter": meter.to_json()}


def _peer(name: str, measure: Any) -> dict[str, Any]:
    """A peer's result; one that fails is reported as such, with why, never as a zero."""
    try:
        got: dict[str, Any] = measure()
    except Exception as e:  # the peer's own trouble: the other sides still report
        got = {"skipped": f"failed: {e}"}
    if "skipped" in got:
        say(f"  {name} skipped: {got['skipped']}")
    else:
        sat, lat = got["saturation"], got["latency"]
        say(
            f"  {name}: {sat['sagas_per_s']:,.1f} sagas/s, {sat['box_us']:,.0f} us box CPU per "
            f"saga; at {lat['rate']:,.1f} sagas/s p50 {lat['p50_ms']:.0f} ms, p99 "
            f"{lat['p99_ms']:.0f} ms; outcomes {sat['outcomes']}"
        )
    return got


def compare(sides: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The goals against each peer that ran: the rate ratio (at least) and the CPU ratio (at
    most). A skipped peer gets no ratio, only its reason."""
    engine = sides["engine"]["saturation"]
    goals: dict[str, dict[str, Any]] = {}
    for peer in PEERS:
        got = sides.get(peer, {"skipped": "not run"})
        if "skipped" in got:
            goals[peer] = {"skipped": got["skipped"]}
            continue
        sat = got["saturation"]
        rate = engine["sagas_per_s"] / sat["sagas_per_s"]
        cpu = engine["box_us"] / sat["box_us"]
        goals[peer] = {
            "rate_ratio": {"value": rate, "at_least": RATE_GOAL, "passed": rate >= RATE_GOAL},
            "cpu_ratio": {"value": cpu, "at_most": CPU_GOAL, "passed": cpu <= CPU_GOAL},
        }
    return goals


def goal_lines(goals: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    for peer, goal in goals.items():
        if "skipped" in goal:
            out.append(f"engine vs {NAMES[peer]}: no ratio, the peer was skipped")
            continue
        r, c = goal["rate_ratio"], goal["cpu_ratio"]
        out.append(
            f"engine vs {NAMES[peer]}: sagas/s x{r['value']:.1f} (goal >= {RATE_GOAL:.0f}: "
            f"{_verdict(r)}), CPU per saga x{c['value']:.3f} (goal <= 1/30: {_verdict(c)})"
        )
    return out


def _verdict(goal: dict[str, Any]) -> str:
    return "PASS" if goal["passed"] else "BELOW"


def summary(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    for side, got in result["sides"].items():
        if "skipped" in got:
            rows.append(("S10", NAMES[side], f"skipped: {got['skipped']}"))
            continue
        sat, lat = got["saturation"], got["latency"]
        parts = ", ".join(
            f"{k} {v / sat['sagas'] * 1e6:,.0f}" for k, v in sat["cpu_s"].items() if v is not None
        )
        rows.append(
            (
                "S10",
                f"{NAMES[side]} ({sat['sagas']} sagas)",
                f"{sat['sagas_per_s']:,.1f} sagas/s; p50 {lat['p50_ms']:.0f} ms, p99 "
                f"{lat['p99_ms']:.0f} ms at {lat['rate']:,.1f}/s; box CPU "
                f"{sat['box_us']:,.0f} us/saga ({parts})",
            )
        )
    for peer, goal in result["goals"].items():
        if "skipped" in goal:
            rows.append(("S10", f"engine / {NAMES[peer]}", "no ratio: the peer was skipped"))
            continue
        r, c = goal["rate_ratio"], goal["cpu_ratio"]
        rows.append(
            (
                "S10",
                f"engine / {NAMES[peer]} sagas/s",
                f"{r['value']:.1f} (goal >= {RATE_GOAL:.0f}: {_verdict(r)})",
            )
        )
        rows.append(
            (
                "S10",
                f"engine / {NAMES[peer]} CPU per saga",
                f"{c['value']:.3f} (goal <= 1/30 = {CPU_GOAL:.3f}: {_verdict(c)})",
            )
        )
    return rows
