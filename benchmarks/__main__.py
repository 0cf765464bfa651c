"""`python -m benchmarks [s1|s4|all] [--events N] [--quick]`: runs scenarios, prints a table."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from benchmarks import s1_backlog, s4_deadlines
from benchmarks.common import (
    Scratch,
    Services,
    machine,
    say,
    scratch,
    services,
    table,
    write_result,
)


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Engine benchmarks, reported as ratios against raw limits from the same run.",
    )
    parser.add_argument("scenario", nargs="?", default="all", choices=["s1", "s4", "all"])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a quick look")
    parser.add_argument("--events", type=int, help="S1 backlog size")
    parser.add_argument("--rounds", type=int, default=3, help="S1 rounds (median ratio)")
    parser.add_argument("--pending", type=int, help="S4 far-future deadlines preloaded")
    parser.add_argument("--seconds", type=int, help="S4 length of the steady phase")
    parser.add_argument("--rate", type=int, help="S4 deadlines coming due per second")
    parser.add_argument("--burst", type=int, help="S4 deadlines due at one instant")
    parser.add_argument("--profile", action="store_true", help="S1: cProfile Worker.process")
    return parser.parse_args(argv)


Summary = Callable[[dict[str, Any]], list[tuple[str, str, str]]]


def _run(
    name: str, args: argparse.Namespace, found: Services, box: Scratch
) -> tuple[dict[str, Any], Summary]:
    if name == "s1":
        events = args.events or (
            s1_backlog.QUICK_EVENTS if args.quick else s1_backlog.DEFAULT_EVENTS
        )
        options1 = s1_backlog.Options(
            events=events, profile=args.profile, rounds=1 if args.quick else args.rounds
        )
        return s1_backlog.run(found, box, options1), s1_backlog.summary
    options4 = s4_deadlines.Options.of(
        quick=args.quick,
        pending=args.pending,
        seconds=args.seconds,
        rate=args.rate,
        burst=args.burst,
    )
    return s4_deadlines.run(found, box, options4), s4_deadlines.summary


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    # The engine's warnings (a rebalance, a failed relay round) stay visible; nothing more.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    wanted = ["s1", "s4"] if args.scenario == "all" else [args.scenario]
    say(f"machine: {machine()}")
    say("numbers on a shared machine are noisy: read the ratios, not the absolute rates")
    rows: list[tuple[str, str, str]] = []
    passed = True
    with services() as found:
        for name in wanted:
            with scratch(found, name) as box:
                result, summarize = _run(name, args, found, box)
            result["quick"] = args.quick
            path = write_result(name, result)
            say(f"{name} results written to {path}")
            rows.extend(summarize(result))
            passed = passed and bool(result["acceptance"]["passed"])
    print()
    print(table(rows, ("scenario", "measure", "value")))
    print()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
