"""Operator commands that read: `show`, `sagas`, `dead-letters` (and its replay).

Every command takes `--json` (one JSON document on stdout, the same data the web console shows).
Exit codes: 0 done; 1 the command ran but found a problem the operator asked about (a retry that
failed again, `sagas stuck` with stuck sagas when `--fail-if-any` is given); 2 refused (no such
saga or dead letter, a missing reason or operator key, bad arguments); 3 the broker did not take
an operator request.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING

from processor.cli_commands import emit, json_flag, text_table
from processor.ops.inspect import (
    replay_dead_letter,
    show_saga,
)
from processor.ops.views import SagaSummary, SagaView, jsonable, step_state
from processor.settings import ProcessorSettings, parse_duration

if TYPE_CHECKING:
    from processor.ports import RecordProducer
    from processor.postgres.inspect import InspectQueries

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_REFUSED = 2
EXIT_NOT_SENT = 3


def duration_arg(text: str) -> timedelta:
    """An argparse type: a duration as the settings take it (`90s`, `15m`, ISO 8601, seconds)."""
    value = parse_duration(text)
    if not isinstance(value, timedelta):
        value = timedelta(seconds=float(value))
    return value


@contextmanager
def inspect_queries(settings: ProcessorSettings) -> Iterator[InspectQueries]:
    """Inspect queries on an autocommit connection of their own, closed on leaving."""
    from processor.postgres.inspect import open_inspect_queries
    from processor.runtime.assembly import tables_for

    with open_inspect_queries(
        settings.database.url.get_secret_value(), tables_for(settings)
    ) as queries:
        yield queries


# -- show ----------------------------------------------------------------------------------------


@contextmanager
def producer(settings: ProcessorSettings) -> Iterator[RecordProducer]:
    """A producer for operator records and dead-letter replays, closed on leaving."""
    from processor.kafka.producer import KafkaRecordProducer, make_producer

    config = settings.kafka.client_config()
    part = settings.consumer.partitioner
    made = KafkaRecordProducer(lambda: make_producer(config, partitioner=part))
    try:
        yield made
    finally:
        made.close(10.0)


def show_arguments(parser: argparse.ArgumentParser) -> None:
    """SAGA_TYPE SAGA_ID, `--limit` timeline rows, `--json`."""
    parser.add_argument("saga_type", metavar="SAGA_TYPE")
    parser.add_argument("saga_id", metavar="SAGA_ID")
    parser.add_argument("--limit", type=int, default=1000, help="at most this many timeline rows")
    json_flag(parser)


def format_view(view: SagaView) -> str:
    """The saga as text: its row, pending work, then the timeline in order."""
    s = view.saga
    lines = [
        f"saga      {s.saga_type} {s.saga_id}",
        f"status    {s.status}" + (f" ({s.parked_reason})" if s.parked_reason else ""),
        (
            f"outcome   {s.machine_state or '-'} at {s.since.isoformat()}"
            if s.status == "ended"
            else f"state     {s.machine_state or '-'}"
            + (f" ({own})" if (own := step_state(view.state)) else "")
            + f" since {s.since.isoformat()}"
        ),
        f"version   {s.version}",
        f"started   {s.created_at.isoformat()}   changed {s.updated_at.isoformat()}",
        "",
        "deadlines:",
        *(
            f"  {d.name}  due {d.due_at.isoformat()}"
            + (f"  dispatched {d.dispatched_at.isoformat()}" if d.dispatched_at else "")
            for d in view.deadlines
        ),
        "parked messages:",
        *(
            f"  #{h.id} {h.message_type} {h.message_id} {h.topic}[{h.partition}]@{h.offset}: "
            f"{h.reason}"
            for h in view.parked_messages
        ),
        "failed outbox rows:",
        *(
            f"  #{f.id} {f.topic} {f.message_id} ({f.attempts}x): {f.reason}"
            for f in view.failed_outbox
        ),
        "",
        "timeline:",
    ]
    for t in view.timeline:
        where = f"{t.topic}[{t.partition}]@{t.offset}" if t.topic else "-"
        version = f" v{t.version}" if t.version is not None else ""
        lines.append(
            f"  {t.at.isoformat()}  {t.outcome:<15} {t.message_type} {t.message_id} {where}"
            f"{version}" + (f"  -- {t.detail}" if t.detail else "")
        )
        for c in (t.effects or {}).get("commands", []):
            lines.append(f"      sent {c['type']} {c['message_id']} -> {c['topic']}")
        for d in (t.effects or {}).get("deadlines", []):
            due = f" due {d['due_at']}" if d.get("due_at") else ""
            lines.append(f"      deadline {d['op']} {d['name']}{due}")
        if (t.effects or {}).get("ended"):
            lines.append("      saga ended")
    return "\n".join(lines)


def show(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Prints one saga in full; exit code 0, 2 when there is no such saga."""
    with inspect_queries(settings) as queries:
        view = show_saga(queries, args.saga_type, args.saga_id, limit=args.limit)
    emit(args, view, format_view(view))
    return EXIT_OK


# -- sagas list | stuck ---------------------------------------------------------------------------


def sagas_arguments(parser: argparse.ArgumentParser) -> None:
    """`list` with filters, `stuck` with a dwell threshold."""
    what = parser.add_subparsers(dest="action", required=True)
    listing = what.add_parser("list", help="sagas, least recently changed first")
    listing.add_argument("--saga-type", default=None)
    listing.add_argument("--status", choices=("active", "parked", "ended"), default=None)
    listing.add_argument(
        "--machine-state",
        default=None,
        help="a machine state, or how ended sagas ended (CANCELLED)",
    )
    listing.add_argument("--older-than", type=duration_arg, default=None, help="e.g. 30m, 2h, 1d")
    listing.add_argument("--limit", type=int, default=100)
    json_flag(listing)
    stuck = what.add_parser("stuck", help="unfinished sagas longest in their state first")
    stuck.add_argument("--saga-type", default=None)
    stuck.add_argument("--older-than", type=duration_arg, default=timedelta(hours=1))
    stuck.add_argument("--limit", type=int, default=100)
    stuck.add_argument("--fail-if-any", action="store_true", help="exit 1 when any is stuck")
    json_flag(stuck)


def format_summaries(rows: Sequence[SagaSummary]) -> str:
    """Saga rows as a text table."""
    if not rows:
        return "no sagas"
    return text_table(
        ("SAGA TYPE", "SAGA ID", "STATUS", "STATE/OUTCOME", "SINCE", "VERSION"),
        (
            (
                r.saga_type,
                r.saga_id,
                r.status,
                r.machine_state or "-",
                r.since.isoformat(),
                str(r.version),
            )
            for r in rows
        ),
    )


def sagas(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Lists sagas or stuck sagas; exit code 0 (1 with `--fail-if-any` and stuck sagas)."""
    with inspect_queries(settings) as queries:
        if args.action == "list":
            rows = queries.list_sagas(
                saga_type=args.saga_type,
                status=args.status,
                machine_state=args.machine_state,
                older_than=args.older_than,
                limit=args.limit,
            )
        else:
            rows = queries.stuck(
                older_than=args.older_than, saga_type=args.saga_type, limit=args.limit
            )
    emit(args, rows, format_summaries(rows))
    if args.action == "stuck" and args.fail_if_any and rows:
        return EXIT_PROBLEM
    return EXIT_OK


# -- dead letters -------------------------------------------------------------------------------


def dead_letter_arguments(parser: argparse.ArgumentParser) -> None:
    """`list|show|replay|purge`."""
    what = parser.add_subparsers(dest="action", required=True)
    listing = what.add_parser("list", help="dead letters, newest first")
    listing.add_argument("--reason-code", dest="reason_code", default=None)
    listing.add_argument("--before", type=int, default=None, help="ids below this (paging)")
    listing.add_argument("--limit", type=int, default=100)
    json_flag(listing)
    for name, help_ in (
        ("show", "one dead letter with its headers and value"),
        ("replay", "send it back to its source topic and partition, then delete it"),
    ):
        sub = what.add_parser(name, help=help_)
        sub.add_argument("id", type=int)
        if name == "replay":
            sub.add_argument("--reason", required=True)
        json_flag(sub)
    purge = what.add_parser("purge", help="delete dead letters for good")
    purge.add_argument("--id", dest="ids", type=int, action="append", default=None)
    purge.add_argument("--older-than", type=duration_arg, default=None)
    purge.add_argument("--reason", required=True)
    json_flag(purge)


def dead_letters(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Lists, shows, replays or purges dead letters; exit code 0, 2 when none matches."""
    with inspect_queries(settings) as queries:
        if args.action == "list":
            rows = queries.dead_letters(
                before=args.before, reason=args.reason_code, limit=args.limit
            )
            text = (
                text_table(
                    ("ID", "TOPIC", "PARTITION", "OFFSET", "REASON", "MESSAGE TYPE", "AT"),
                    (
                        (
                            str(r.id),
                            r.topic,
                            str(r.partition),
                            str(r.offset),
                            r.reason,
                            r.message_type or "-",
                            r.created_at.isoformat(),
                        )
                        for r in rows
                    ),
                )
                if rows
                else "no dead letters"
            )
            emit(args, rows, text)
        elif args.action == "show":
            try:
                row, _, _ = queries.dead_letter(args.id)
            except LookupError as e:
                print(f"saga-processor: {e}", file=sys.stderr)
                return EXIT_REFUSED
            emit(args, row, json.dumps(jsonable(row), indent=2, sort_keys=True))
        elif args.action == "replay":
            with producer(settings) as out:
                row = replay_dead_letter(queries, out, args.id)
            emit(args, row, f"dead letter {row.id} sent back to {row.topic}[{row.partition}]")
        else:
            if not args.ids and args.older_than is None:
                print("saga-processor: name --id or --older-than", file=sys.stderr)
                return EXIT_REFUSED
            n = queries.purge_dead_letters(args.ids, args.older_than)
            emit(args, {"purged": n}, f"{n} dead letters purged")
    return EXIT_OK


# -- operator requests -------------------------------------------------------------------------


# -- the web console ----------------------------------------------------------------------------
