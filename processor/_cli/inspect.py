"""Operator commands that read: `show`, `sagas`, `audit`, `dead-letters` (and its replay, purge).

Every command takes `--json` (one JSON document on stdout, the same data the web console shows).
Exit codes, the same for every command: 0 done; 1 the command ran and found what the operator
asked about (a retry that failed again, `sagas stuck --fail-if-any` with stuck sagas) or was
refused (no such saga or dead letter, a request the processor refused); 2 a usage or
configuration mistake (bad arguments, a missing reason or operator key); 3 a service did not
answer (the database, the broker), or no processor applied a request in time.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from processor._cli.commands import (
    emit,
    inspect_queries,
    json_flag,
    operator_name,
    producer,
    text_table,
)
from processor._cli.follow import follow, follow_arguments, format_entry, format_step
from processor._cli.journal import format_journal
from processor._errors import SagaError
from processor._ports.views import AuditRow, SagaSummary, SagaView, jsonable, step_state
from processor.ops._filters import cursor, list_filters
from processor.ops._inspect import (
    NoSuchSaga,
    purge_dead_letters,
    replay_dead_letter,
    show_saga,
)
from processor.settings import ProcessorSettings, parse_duration

if TYPE_CHECKING:
    pass

EXIT_OK = 0
EXIT_PROBLEM = 1
"""Found what was asked about, or refused: the command ran and the answer is no."""
EXIT_REFUSED = EXIT_PROBLEM
EXIT_USAGE = 2
"""Bad arguments or configuration (argparse's own usage errors exit 2 as well)."""
EXIT_NOT_SENT = 3
"""A service did not answer, or no processor applied a request in time: nothing is known done."""


def duration_arg(text: str) -> timedelta:
    """An argparse type: a duration as the settings take it (`90s`, `15m`, ISO 8601, seconds)."""
    value = parse_duration(text)
    if not isinstance(value, timedelta):
        value = timedelta(seconds=float(value))
    return value


# -- show ----------------------------------------------------------------------------------------


def show_arguments(parser: argparse.ArgumentParser) -> None:
    """SAGA_TYPE SAGA_ID, `--limit` timeline rows, `--json`."""
    parser.add_argument("saga_type", metavar="SAGA_TYPE")
    parser.add_argument("saga_id", metavar="SAGA_ID")
    parser.add_argument("--limit", type=int, default=1000, help="at most this many timeline rows")
    json_flag(parser)
    follow_arguments(parser)


def format_view(view: SagaView) -> str:
    """The saga as text: its row, a saga function's journal, pending work, then the timeline."""
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
        *format_step(view.step),
        f"version   {s.version}",
        f"started   {s.created_at.isoformat()}   changed {s.updated_at.isoformat()}",
        *format_journal(view.journal),
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
        "operator actions:",
        *(f"  {format_audit_entry(a)}" for a in view.audit),
        "",
        "timeline:",
    ]
    for t in view.timeline:
        lines.extend(format_entry(t))
    return "\n".join(lines)


def format_audit_entry(a: AuditRow) -> str:
    """One audit entry on one line: when, who, what, how it ended, why, what it touched."""
    target = json.dumps(a.target, sort_keys=True, separators=(",", ":"))
    return f"{a.at.isoformat()}  {a.actor}  {a.action}  {a.outcome}: {a.reason or '-'}  {target}"


def show(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Prints one saga in full; exit code 0, 1 when there is no such saga.

    With `--follow`, then each history row as it is committed, until the saga ends (see
    :mod:`processor._cli.follow`).
    """
    with inspect_queries(settings) as queries:
        view = show_saga(queries, args.saga_type, args.saga_id, limit=args.limit)
    emit(args, view, format_view(view))
    if args.follow:
        sys.stdout.flush()
        return follow(args, settings, view)
    return EXIT_OK


# -- sagas list | stuck ---------------------------------------------------------------------------


def sagas_arguments(parser: argparse.ArgumentParser) -> None:
    """`list` with filters, `stuck` with a dwell threshold."""
    what = parser.add_subparsers(dest="action", required=True)
    listing = what.add_parser("list", help="sagas, least recently changed first")
    # The console's filters, read and refused by the same code (`processor.ops._filters`).
    listing.add_argument("--type", "--saga-type", dest="saga_type", default=None)
    listing.add_argument("--status", default=None, help="active, parked or ended")
    listing.add_argument(
        "--machine-state",
        default=None,
        help="a machine state, or how ended sagas ended (CANCELLED)",
    )
    listing.add_argument("--older-than", default=None, help="unchanged this long: 30m, 2h, 1d")
    listing.add_argument("--outcome", default=None, help="ended sagas that ended so (COMPLETED)")
    listing.add_argument("--correlation-id", default=None, help="started by this correlation-id")
    listing.add_argument(
        "--state-contains",
        "--attr",
        dest="state_contains",
        default=None,
        help="a state search, path=value (customer_id=c-7, address.country=DE)",
    )
    listing.add_argument("--after", default=None, help="the cursor a previous page printed")
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


_LIST_OPTIONS = {
    "type": "saga_type",
    "status": "status",
    "state": "machine_state",
    "older_than": "older_than",
    "outcome": "outcome",
    "correlation": "correlation_id",
    "attr": "state_contains",
    "after": "after",
}
"""The console's query parameters and the `sagas list` options (their `dest`) they are."""


def list_sagas(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """One page of sagas, filtered as the console filters them, then the next page's cursor.

    A malformed filter is refused in one line naming its option (exit code 2). The cursor is
    printed when the page is full (`--after CURSOR` reads the next); `--json` prints
    ``{"sagas": [...], "next": CURSOR or null}``.
    """
    params = {name: getattr(args, dest) or "" for name, dest in _LIST_OPTIONS.items()}
    names = {name: "--" + dest.replace("_", "-") for name, dest in _LIST_OPTIONS.items()}
    filters = list_filters(params, names)
    if args.limit < 1:
        raise SagaError("bad --limit: at least 1")
    with inspect_queries(settings) as queries:
        rows = queries.list_sagas(**filters, limit=args.limit)
    following = cursor(rows[-1]) if len(rows) == args.limit else None
    text = format_summaries(rows)
    if following is not None:
        text += f"\nnext page: --after {shlex.quote(following)}"
    emit(args, {"sagas": rows, "next": following}, text)
    return EXIT_OK


def sagas(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Lists sagas or stuck sagas; exit code 0 (1 with `--fail-if-any` and stuck sagas)."""
    if args.action == "list":
        return list_sagas(args, settings)
    with inspect_queries(settings) as queries:
        rows = queries.stuck(older_than=args.older_than, saga_type=args.saga_type, limit=args.limit)
    emit(args, rows, format_summaries(rows))
    if args.fail_if_any and rows:
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
    """Lists, shows, replays or purges dead letters; exit code 0, 1 when none matches.

    A replay or purge is recorded in the audit trail (`audit list`) with the rows it deleted,
    in their transaction.
    """
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
                raise NoSuchSaga(str(e)) from None
            emit(args, row, json.dumps(jsonable(row), indent=2, sort_keys=True))
        elif args.action == "replay":
            with producer(settings) as out:
                row = replay_dead_letter(
                    queries, out, args.id, actor=operator_name(settings), reason=args.reason
                )
            emit(args, row, f"dead letter {row.id} sent back to {row.topic}[{row.partition}]")
        else:
            if not args.ids and args.older_than is None:
                raise SagaError("name --id or --older-than")
            n = purge_dead_letters(
                queries,
                actor=operator_name(settings),
                reason=args.reason,
                ids=args.ids,
                older_than=args.older_than,
            )
            emit(args, {"purged": n}, f"{n} dead letters purged")
            if args.ids and n == 0:
                # Named rows that are not there: nothing was done.
                return EXIT_PROBLEM
    return EXIT_OK


# -- the audit trail -----------------------------------------------------------------------------


def audit_arguments(parser: argparse.ArgumentParser) -> None:
    """`audit list` with filters."""
    what = parser.add_subparsers(dest="action", required=True)
    listing = what.add_parser("list", help="operator actions, newest first")
    listing.add_argument(
        "--since", type=duration_arg, default=None, help="only the last so long (e.g. 2h, 1d)"
    )
    listing.add_argument("--saga-type", default=None, help="only actions on this saga type")
    listing.add_argument("--saga-id", default=None, help="only actions on this saga id")
    listing.add_argument(
        "--action",
        dest="only_action",
        default=None,
        help="only this action: terminate, parked-skip, dead-letter-purge, outbox-discard, ...",
    )
    listing.add_argument(
        "--batch", default=None, help="only this batch's entries (`saga ... --where` prints its id)"
    )
    listing.add_argument("--limit", type=int, default=100, help="at most this many entries")
    json_flag(listing)


def audit(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Lists recorded operator actions, newest first; exit code 0."""
    with inspect_queries(settings) as queries:
        rows = queries.audit(
            since=args.since,
            saga_type=args.saga_type,
            saga_id=args.saga_id,
            action=args.only_action,
            limit=args.limit,
            batch=args.batch,
        )
    text = (
        text_table(
            ("AT", "ACTOR", "ACTION", "SAGA", "OUTCOME", "REASON", "TARGET"),
            (
                (
                    a.at.isoformat(),
                    a.actor,
                    a.action,
                    f"{a.saga_type} {a.saga_id}" if a.saga_type else "-",
                    a.outcome,
                    a.reason or "-",
                    json.dumps(a.target, sort_keys=True, separators=(",", ":")),
                )
                for a in rows
            ),
        )
        if rows
        else "no operator actions recorded"
    )
    emit(args, rows, text)
    return EXIT_OK


# -- operator requests -------------------------------------------------------------------------


# -- the web console ----------------------------------------------------------------------------
