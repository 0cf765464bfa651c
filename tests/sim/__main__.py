"""Runs simulated schedules: one seed again, a range of seeds, or a soak for some minutes.

    python -m tests.sim --seed N [--shrink]      replays one schedule (the same trace hash)
    python -m tests.sim --seeds K [--start S]    K schedules from seed S (default: a new base)
    python -m tests.sim --minutes M              schedules until M minutes are up
    --bug NAME (repeatable) puts a fixed runtime bug back; --bugs lists them

Exits 1 when a schedule fails, after its report and the command that replays it.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from collections import Counter

from tests.sim.bugs import BUGS
from tests.sim.run import STEPS, Result, describe, replay_command, run, shrink

PROGRESS_EVERY = 10.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--seed", type=int, help="replay this schedule")
    what.add_argument("--seeds", type=int, help="run this many schedules")
    what.add_argument("--minutes", type=float, help="run schedules for this long")
    what.add_argument("--bugs", action="store_true", help="list the bugs --bug can put back")
    parser.add_argument("--start", type=int, help="the first seed of --seeds or --minutes")
    parser.add_argument("--steps", type=int, default=STEPS, help="scheduled steps per run")
    parser.add_argument("--shrink", action="store_true", help="with --seed: fewest faults")
    parser.add_argument(
        "--disable", default="", help="with --seed: faults left out, by number (1,4,...)"
    )
    parser.add_argument("--bug", action="append", default=[], choices=sorted(BUGS))
    args = parser.parse_args(argv)
    if args.bugs:
        for name, (what_it_was, _) in BUGS.items():
            print(f"{name}: {what_it_was}")
        return 0
    if args.seed is not None:
        disabled = [int(n) for n in args.disable.split(",") if n.strip()]
        return _one(args.seed, args.steps, args.bug, args.shrink, disabled)
    start = args.start if args.start is not None else secrets.randbelow(10**9)
    if args.minutes is not None:
        return _many(start, None, time.monotonic() + 60 * args.minutes, args.steps, args.bug)
    return _many(start, args.seeds or 1000, None, args.steps, args.bug)


def _one(seed: int, steps: int, bugs: list[str], shrinking: bool, disabled: list[int]) -> int:
    if shrinking:
        result, kept = shrink(seed, steps=steps, bugs=bugs)
        print(f"faults kept: {kept or 'none'} of the schedule's")
    else:
        result = run(seed, steps=steps, bugs=bugs, disabled=disabled)
    print(f"seed {seed}: trace {result.trace}, {result.steps} decisions, faults {_kinds(result)}")
    if result.ok:
        print("every invariant held")
        return 0
    print(describe(result))
    return 1


def _many(start: int, count: int | None, until: float | None, steps: int, bugs: list[str]) -> int:
    print(f"seeds from {start}" + (f", bugs put back: {', '.join(bugs)}" if bugs else ""))
    faults: Counter[str] = Counter()
    checks: Counter[str] = Counter()
    failed: list[Result] = []
    began = last = time.monotonic()
    seed, runs = start, 0
    while (count is None or runs < count) and (until is None or time.monotonic() < until):
        result = run(seed, steps=steps, bugs=bugs)
        runs += 1
        faults.update(result.faults)
        checks.update(result.checks)
        if not result.ok:
            failed.append(result)
            print(describe(result), flush=True)
        seed += 1
        now = time.monotonic()
        if now - last >= PROGRESS_EVERY:
            last = now
            rate = runs / (now - began)
            print(
                f"[{now - began:6.0f} s] {runs} schedules ({rate:.0f}/s), "
                f"{sum(faults.values())} faults, {sum(checks.values())} invariant checks, "
                f"{len(failed)} failed",
                flush=True,
            )
    took = time.monotonic() - began
    print(f"{runs} schedules (seeds {start}..{seed - 1}) in {took:.0f} s, {len(failed)} failed")
    print("faults injected: " + ", ".join(f"{k} {v}" for k, v in sorted(faults.items())))
    print("invariants checked: " + ", ".join(f"{k} {v}" for k, v in sorted(checks.items())))
    for result in failed:
        print(f"  replay: {replay_command(result)}")
    return 1 if failed else 0


def _kinds(result: Result) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(result.faults.items())) or "none"


if __name__ == "__main__":
    sys.exit(main())
