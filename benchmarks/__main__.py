"""`python -m benchmarks [s1|...|s11|all] [--quick]`: run scenarios, write a report.

A table of the results is printed at the end.

The report is `.local/bench/<start time>.json`; the engine's cProfile from S1 is kept beside it
(`<start time>-s1.prof` and the top functions as text in `<start time>-s1-profile.txt`), and
S11's of each side (`<start time>-s11-function.prof`, `...-s11-function-profile.txt`). The
issue's goals are benchmark goals: each is printed PASS or BELOW, and the exit status says only
whether every scenario ran.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from benchmarks import (
    s1_backlog,
    s2_latency,
    s3_relay,
    s4_deadlines,
    s5_resume,
    s6_soak,
    s7_replicas,
    s8_citus,
    s9_layouts,
    s10_engines,
    s11_functions,
)
from benchmarks.common import (
    RESULTS_DIR,
    Scratch,
    Services,
    machine,
    say,
    scratch,
    services,
    table,
    write_report,
)

# S4 preloads a large deadline table and S6 is a soak (10 minutes unless --soak-seconds says
# otherwise; 45 s with --quick, too short for table sizes to settle in less): each runs when
# named, or in a full (not quick) run, so that a quick run of all stays within two minutes.
# S10 runs two other engines beside this one (and may build Temporal's server first): it too
# runs when named or in a full run.
QUICK_ALL = ["s1", "s2", "s3", "s5", "s7"]
FULL_ALL = ["s1", "s2", "s3", "s5", "s7", "s4", "s6", "s8", "s9", "s10", "s11"]
SCENARIOS = ["s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11"]


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Engine benchmarks, reported as ratios against raw limits from the same run.",
    )
    parser.add_argument(
        "scenario",
        nargs="?",
        default="all",
        choices=[*SCENARIOS, "all"],
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a quick look")
    parser.add_argument("--events", type=int, help="S1 backlog size")
    parser.add_argument(
        "--rounds",
        type=int,
        help=(
            "rounds of S1, S2, S5 and S11 (median ratio; default 3, 1 for S2, S5 and S11 with "
            "--quick)"
        ),
    )
    parser.add_argument("--no-profile", action="store_true", help="S1, S11: skip the profiled runs")
    parser.add_argument("--rate", type=int, help="S2 events/s (default: half of S1's engine)")
    parser.add_argument("--pending", type=int, help="S4 far-future deadlines preloaded")
    parser.add_argument("--seconds", type=int, help="S4 length of the steady phase")
    parser.add_argument("--deadline-rate", type=int, help="S4 deadlines coming due per second")
    parser.add_argument("--burst", type=int, help="S4 deadlines due at one instant")
    parser.add_argument("--soak-seconds", type=int, help="S6 length of the soak (default 600)")
    parser.add_argument("--outbox-rows", type=int, help="S3 outbox rows preloaded")
    parser.add_argument("--replica-events", type=int, help="S7 backlog size")
    parser.add_argument("--sagas", type=int, help="S10 backlog size of this engine, in sagas")
    parser.add_argument("--dbos-sagas", type=int, help="S10 backlog size of the DBOS peer")
    parser.add_argument("--temporal-sagas", type=int, help="S10 backlog size of the Temporal peer")
    parser.add_argument("--trips", type=int, help="S11 backlog size in trips (4 events each)")
    return parser.parse_args(argv)


Summary = Callable[[dict[str, Any]], list[tuple[str, str, str]]]


def _run(
    name: str, args: argparse.Namespace, found: Services, box: Scratch, done: dict[str, Any]
) -> tuple[dict[str, Any], Summary]:
    if name == "s1":
        events = args.events or (
            s1_backlog.QUICK_EVENTS if args.quick else s1_backlog.DEFAULT_EVENTS
        )
        options1 = s1_backlog.Options(
            events=events, profile=not args.no_profile, rounds=args.rounds or 3
        )
        return s1_backlog.run(found, box, options1), s1_backlog.summary
    if name == "s2":
        rate = args.rate
        if rate is None and "s1" in done:
            rate = int(done["s1"]["median"]["engine"]["events_per_s"] * 0.5)
        options2 = s2_latency.Options.of(quick=args.quick, rate=rate, rounds=args.rounds)
        return s2_latency.run(found, box, options2), s2_latency.summary
    if name == "s6":
        options6 = s6_soak.Options.of(quick=args.quick, seconds=args.soak_seconds)
        return s6_soak.run(found, box, options6), s6_soak.summary
    if name == "s3":
        options3 = s3_relay.Options.of(quick=args.quick, rows=args.outbox_rows)
        return s3_relay.run(found, box, options3), s3_relay.summary
    if name == "s7":
        options7 = s7_replicas.Options.of(quick=args.quick, events=args.replica_events)
        return s7_replicas.run(found, box, options7), s7_replicas.summary
    if name == "s8":
        options8 = s8_citus.Options.of(quick=args.quick, events=args.events, rounds=args.rounds)
        return s8_citus.run(found, box, options8), s8_citus.summary
    if name == "s9":
        options9 = s9_layouts.Options.of(quick=args.quick, events=args.events, rounds=args.rounds)
        return s9_layouts.run(found, box, options9), s9_layouts.summary
    if name == "s10":
        options10 = s10_engines.Options.of(
            quick=args.quick,
            sagas=args.sagas,
            dbos_sagas=args.dbos_sagas,
            temporal_sagas=args.temporal_sagas,
        )
        return s10_engines.run(found, box, options10), s10_engines.summary
    if name == "s11":
        options11 = s11_functions.Options.of(
            quick=args.quick, trips=args.trips, rounds=args.rounds, profile=not args.no_profile
        )
        return s11_functions.run(found, box, options11), s11_functions.summary
    if name == "s5":
        options5 = s5_resume.Options.of(quick=args.quick, rounds=args.rounds)
        return s5_resume.run(found, box, options5), s5_resume.summary
    options4 = s4_deadlines.Options.of(
        quick=args.quick,
        pending=args.pending,
        seconds=args.seconds,
        rate=args.deadline_rate,
        burst=args.burst,
    )
    return s4_deadlines.run(found, box, options4), s4_deadlines.summary


def _keep_profile(
    stamp: str, result: dict[str, Any], label: str = "s1", into: dict[str, Any] | None = None
) -> None:
    """Writes a profile (S1's, or one of S11's sides) beside the report and leaves only its
    file names in the JSON (in ``into``, by ``label``, when given)."""
    stats = result.pop("profile_stats", None)
    text = result.pop("profile", None)
    files: dict[str, str] = {}
    if stats is not None:
        prof = RESULTS_DIR / f"{stamp}-{label}.prof"
        stats.dump_stats(prof)
        files["profile_file"] = str(prof)
    if text:
        path = RESULTS_DIR / f"{stamp}-{label}-profile.txt"
        path.write_text(text)
        files["profile_text"] = str(path)
    if into is None:
        result.update(files)
    else:
        into[label] = files


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    # The engine's warnings (a rebalance, a failed relay round) stay visible; nothing more.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    wanted = [args.scenario]
    if args.scenario == "all":
        wanted = QUICK_ALL if args.quick else FULL_ALL
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    started = time.monotonic()
    say(f"machine: {machine()}")
    say("numbers on a shared machine are noisy: read the ratios, not the absolute rates")
    if args.quick and args.scenario == "all":
        say(
            "S4, S6 and S8-S11 are left out of a quick run: "
            "`python -m benchmarks s4 --quick` (and so on) runs one"
        )
    rows: list[tuple[str, str, str]] = []
    results: dict[str, Any] = {"quick": args.quick}
    with services() as found:
        for name in wanted:
            with scratch(found, name) as box:
                result, summarize = _run(name, args, found, box, results)
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            if name == "s1":
                _keep_profile(stamp, result)
            for side, got in result.pop("profiles", {}).items():
                _keep_profile(stamp, got, f"{name}-{side}", into=result.setdefault("profile", {}))
            results[name] = result
            rows.extend(summarize(result))
            path = write_report(stamp, results)
    say(f"report written to {path} ({time.monotonic() - started:.0f} s)")
    print()
    print(table(rows, ("scenario", "measure", "value")))
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
