"""`show`'s step in flight and its `--follow`: the history as it is committed, until the end.

`--follow` prints the timeline, then polls the saga's history by row id (every second) and
prints each new row; it stops once a row ends the saga, after `--follow-seconds`, or on Ctrl-C
(exit code 0 each time). With `--json`, each new row is one JSON document on a line of its own.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

from processor._ports.views import SagaView, StepProgress, TimelineEntry, jsonable
from processor.settings import ProcessorSettings

__all__ = ["follow", "follow_arguments", "format_entry", "format_step"]

POLL_SECONDS = 1.0


def follow_arguments(parser: argparse.ArgumentParser) -> None:
    """`--follow` and `--follow-seconds N`."""
    parser.add_argument(
        "--follow",
        action="store_true",
        help="then print each new history row as it is committed, until the saga ends",
    )
    parser.add_argument(
        "--follow-seconds",
        type=float,
        default=None,
        help="stop following after this many seconds (default: until the end, or Ctrl-C)",
    )


def format_step(step: StepProgress | None) -> list[str]:
    """The step in flight as `show`'s lines: the attempt, what is due when, the last failure."""
    if step is None:
        return []
    lines = []
    if step.step is not None:
        undo = "undo of " if step.phase == "undo" else ""
        line = f"step      {undo}{step.step}, attempt {step.attempt}"
        if step.waiting == "timeout" and step.due_at is not None:
            line += f", times out {step.due_at.isoformat()}"
        elif step.next_attempt is not None and step.due_at is not None:
            line += f", attempt {step.next_attempt} due {step.due_at.isoformat()}"
            line += " (breaker open)" if step.waiting == "resume" else ""
        elif step.waiting is not None and step.due_at is not None:
            line += f", {step.waiting} until {step.due_at.isoformat()}"
        lines.append(line)
    if step.last_failure is not None:
        lines.append(f"failure   {step.last_failure}")
    return lines


def format_entry(t: TimelineEntry) -> list[str]:
    """One timeline row, then what it sent, scheduled and whether it ended the saga."""
    where = f"{t.topic}[{t.partition}]@{t.offset}" if t.topic else "-"
    version = f" v{t.version}" if t.version is not None else ""
    lines = [
        f"  {t.at.isoformat()}  {t.outcome:<15} {t.message_type} {t.message_id} {where}"
        f"{version}" + (f"  -- {t.detail}" if t.detail else "")
    ]
    for c in (t.effects or {}).get("commands", []):
        lines.append(f"      sent {c['type']} {c['message_id']} -> {c['topic']}")
    for d in (t.effects or {}).get("deadlines", []):
        due = f" due {d['due_at']}" if d.get("due_at") else ""
        lines.append(f"      deadline {d['op']} {d['name']}{due}")
    if (t.effects or {}).get("ended"):
        lines.append("      saga ended")
    return lines


def follow(
    args: argparse.Namespace,
    settings: ProcessorSettings,
    view: SagaView,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Prints the saga's history rows committed after ``view``'s, until it ends; exit code 0."""
    from processor._cli.commands import inspect_queries

    if view.saga.status == "ended":
        return 0
    s = view.saga
    last = view.timeline[-1].id if view.timeline else 0
    until = None if args.follow_seconds is None else clock() + max(0.0, args.follow_seconds)
    try:
        with inspect_queries(settings) as queries:
            while True:
                rows = queries.timeline(s.saga_type, s.saga_id, after=last)
                for t in rows:
                    if args.json:
                        print(json.dumps(jsonable(t), sort_keys=True))
                    else:
                        print("\n".join(format_entry(t)))
                    last = t.id
                sys.stdout.flush()
                if any((t.effects or {}).get("ended") for t in rows):
                    return 0
                left = None if until is None else until - clock()
                if left is not None and left <= 0:
                    return 0
                sleep(POLL_SECONDS if left is None else min(POLL_SECONDS, left))
    except KeyboardInterrupt:
        return 0
