"""Operator commands: `show`, `sagas`, `dead-letters`, `saga cancel`, deadline and parked actions.

Every command takes `--json` (one JSON document on stdout, the same data the web console shows).
Exit codes: 0 done; 1 the command ran but found a problem the operator asked about (a retry that
failed again, `sagas stuck` with stuck sagas when `--fail-if-any` is given); 2 refused (no such
saga or dead letter, a missing reason or operator key, bad arguments); 3 the broker did not take
an operator request.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from processor.cli_commands import app_of, text_table
from processor.ops.inspect import (
    OperatorRefused,
    replay_dead_letter,
    send_operator_request,
    show_saga,
    wait_for_outcome,
)
from processor.ops.views import SagaSummary, SagaView, jsonable
from processor.settings import ProcessorSettings, parse_duration
from processor.wire import OperatorAction, OperatorRecord

if TYPE_CHECKING:
    from processor.ports import RecordProducer
    from processor.postgres.inspect import InspectQueries

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_REFUSED = 2
EXIT_NOT_SENT = 3


def _duration(text: str) -> timedelta:
    value = parse_duration(text)
    if not isinstance(value, timedelta):
        value = timedelta(seconds=float(value))
    return value


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    if args.json:
        json.dump(jsonable(data), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print(text)


@contextmanager
def inspect_queries(settings: ProcessorSettings) -> Iterator[InspectQueries]:
    """Inspect queries on an autocommit connection of their own, closed on leaving."""
    from processor.postgres.inspect import open_inspect_queries
    from processor.runtime.assembly import tables_for

    with open_inspect_queries(
        settings.database.url.get_secret_value(), tables_for(settings)
    ) as queries:
        yield queries


def operator_route(settings: ProcessorSettings) -> Callable[[str, bytes, int], int]:
    """Routes operator records to where the saga's events go now (input topics may grow)."""
    from processor.postgres.connect import connect
    from processor.postgres.growth import current_router
    from processor.runtime.assembly import tables_for

    url = settings.database.url.get_secret_value()
    cs = settings.consumer
    return current_router(lambda: connect(url), tables_for(settings), cs.group_id, cs.partitioner)


@contextmanager
def producer(settings: ProcessorSettings) -> Iterator[RecordProducer]:
    """A producer for operator records and dead-letter replays, closed on leaving."""
    from processor.kafka.producer import KafkaRecordProducer, make_producer

    config = settings.kafka.client_config()
    made = KafkaRecordProducer(lambda: make_producer(config))
    try:
        yield made
    finally:
        made.close(10.0)


def operator_name(settings: ProcessorSettings) -> str:
    """Who is asking: `SAGA_OPERATOR__NAME`, else the OS user."""
    return settings.operator.name or getpass.getuser()


# -- show ----------------------------------------------------------------------------------------


def show_arguments(parser: argparse.ArgumentParser) -> None:
    """SAGA_TYPE SAGA_ID, `--limit` timeline rows, `--json`."""
    parser.add_argument("saga_type", metavar="SAGA_TYPE")
    parser.add_argument("saga_id", metavar="SAGA_ID")
    parser.add_argument("--limit", type=int, default=1000, help="at most this many timeline rows")
    _json_flag(parser)


def format_view(view: SagaView) -> str:
    """The saga as text: its row, pending work, then the timeline in order."""
    s = view.saga
    lines = [
        f"saga      {s.saga_type} {s.saga_id}",
        f"status    {s.status}" + (f" ({s.parked_reason})" if s.parked_reason else ""),
        f"state     {s.machine_state or '-'} since {s.since.isoformat()}",
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
    _emit(args, view, format_view(view))
    return EXIT_OK


# -- sagas list | stuck ---------------------------------------------------------------------------


def sagas_arguments(parser: argparse.ArgumentParser) -> None:
    """`list` with filters, `stuck` with a dwell threshold."""
    what = parser.add_subparsers(dest="action", required=True)
    listing = what.add_parser("list", help="sagas, least recently changed first")
    listing.add_argument("--saga-type", default=None)
    listing.add_argument("--status", choices=("active", "parked", "ended"), default=None)
    listing.add_argument("--machine-state", default=None)
    listing.add_argument("--older-than", type=_duration, default=None, help="e.g. 30m, 2h, 1d")
    listing.add_argument("--limit", type=int, default=100)
    _json_flag(listing)
    stuck = what.add_parser("stuck", help="unfinished sagas longest in their state first")
    stuck.add_argument("--saga-type", default=None)
    stuck.add_argument("--older-than", type=_duration, default=timedelta(hours=1))
    stuck.add_argument("--limit", type=int, default=100)
    stuck.add_argument("--fail-if-any", action="store_true", help="exit 1 when any is stuck")
    _json_flag(stuck)


def format_summaries(rows: Sequence[SagaSummary]) -> str:
    """Saga rows as a text table."""
    if not rows:
        return "no sagas"
    return text_table(
        ("SAGA TYPE", "SAGA ID", "STATUS", "MACHINE STATE", "SINCE", "VERSION"),
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
    _emit(args, rows, format_summaries(rows))
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
    _json_flag(listing)
    for name, help_ in (
        ("show", "one dead letter with its headers and value"),
        ("replay", "send it back to its source topic and partition, then delete it"),
    ):
        sub = what.add_parser(name, help=help_)
        sub.add_argument("id", type=int)
        if name == "replay":
            sub.add_argument("--reason", required=True)
        _json_flag(sub)
    purge = what.add_parser("purge", help="delete dead letters for good")
    purge.add_argument("--id", dest="ids", type=int, action="append", default=None)
    purge.add_argument("--older-than", type=_duration, default=None)
    purge.add_argument("--reason", required=True)
    _json_flag(purge)


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
            _emit(args, rows, text)
        elif args.action == "show":
            try:
                row, _, _ = queries.dead_letter(args.id)
            except LookupError as e:
                print(f"saga-processor: {e}", file=sys.stderr)
                return EXIT_REFUSED
            _emit(args, row, json.dumps(jsonable(row), indent=2, sort_keys=True))
        elif args.action == "replay":
            with producer(settings) as out:
                row = replay_dead_letter(queries, out, args.id)
            _emit(args, row, f"dead letter {row.id} sent back to {row.topic}[{row.partition}]")
        else:
            if not args.ids and args.older_than is None:
                print("saga-processor: name --id or --older-than", file=sys.stderr)
                return EXIT_REFUSED
            n = queries.purge_dead_letters(args.ids, args.older_than)
            _emit(args, {"purged": n}, f"{n} dead letters purged")
    return EXIT_OK


# -- operator requests -------------------------------------------------------------------------


def saga_arguments(parser: argparse.ArgumentParser) -> None:
    """`cancel SAGA_TYPE SAGA_ID --reason`."""
    what = parser.add_subparsers(dest="action", required=True)
    cancel = what.add_parser("cancel", help="run the saga's cancel (compensation) path")
    cancel.add_argument("saga_type", metavar="SAGA_TYPE")
    cancel.add_argument("saga_id", metavar="SAGA_ID")
    cancel.add_argument("--reason", required=True)
    _json_flag(cancel)


def request(
    args: argparse.Namespace,
    settings: ProcessorSettings,
    action: OperatorAction,
    name: str | None = None,
) -> int:
    """Sends one operator request; exit code 0 once the broker has it, 3 if it did not."""
    sent = send(args, settings, action, name)
    if isinstance(sent, int):
        return sent
    _emit(
        args,
        sent,
        f"{action} of {args.saga_type} {args.saga_id} sent as {sent.message_id}; "
        "`show` lists it once applied",
    )
    return EXIT_OK


def send(
    args: argparse.Namespace,
    settings: ProcessorSettings,
    action: OperatorAction,
    name: str | None = None,
) -> OperatorRecord | int:
    """Sends one operator request; the request once the broker has it, else exit code 3."""
    from processor.runtime.assembly import operator_key

    with inspect_queries(settings) as queries, producer(settings) as out:
        try:
            sent = send_operator_request(
                queries,
                out,
                operator_key(settings),
                action=action,
                saga_type=args.saga_type,
                saga_id=args.saga_id,
                by=operator_name(settings),
                reason=args.reason,
                name=name,
                route=operator_route(settings),
            )
        except OperatorRefused as e:
            if "broker" not in str(e):
                raise
            print(f"saga-processor: {e}", file=sys.stderr)
            return EXIT_NOT_SENT
    return sent


def saga(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """`saga cancel`: see :func:`request`."""
    return request(args, settings, OperatorAction.CANCEL)


def deadline_arguments(parser: argparse.ArgumentParser) -> None:
    """`deadlines SAGA_TYPE SAGA_ID` lists; `deadlines fire-now|cancel T ID NAME --reason`."""
    parser.add_argument("words", nargs="+", metavar="[fire-now|cancel] SAGA_TYPE SAGA_ID [NAME]")
    parser.add_argument("--reason", default=None, help="why (required for fire-now and cancel)")
    _json_flag(parser)


def deadlines(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Lists a saga's deadlines, or sends a fire-now or cancel request for one."""
    from processor import cli_commands

    words = list(args.words)
    if words[0] in ("fire-now", "cancel"):
        if len(words) != 4 or not args.reason:
            print(
                "saga-processor: deadlines fire-now|cancel SAGA_TYPE SAGA_ID NAME --reason WHY",
                file=sys.stderr,
            )
            return EXIT_REFUSED
        args.saga_type, args.saga_id, name = words[1:]
        action = (
            OperatorAction.DEADLINE_FIRE_NOW
            if words[0] == "fire-now"
            else OperatorAction.DEADLINE_CANCEL
        )
        return request(args, settings, action, name)
    if len(words) != 2:
        print("saga-processor: deadlines SAGA_TYPE SAGA_ID", file=sys.stderr)
        return EXIT_REFUSED
    args.saga_type, args.saga_id = words
    if args.json:
        with inspect_queries(settings) as queries:
            rows = queries.deadlines(args.saga_type, args.saga_id)
        _emit(args, rows, "")
        return EXIT_OK
    return cli_commands.deadlines(args, settings)


def parked_arguments(parser: argparse.ArgumentParser) -> None:
    """`parked` lists; `parked retry|skip SAGA_TYPE SAGA_ID --reason`."""
    parser.add_argument("words", nargs="*", metavar="[retry|skip SAGA_TYPE SAGA_ID]")
    parser.add_argument("--limit", type=int, default=100, help="at most this many sagas")
    parser.add_argument("--reason", default=None, help="why (required for retry and skip)")
    parser.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait for the processor's outcome"
    )
    _json_flag(parser)


def parked(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Lists parked sagas, or asks the processor to retry (or skip) one and waits for it.

    A retry replays the held messages; a skip drops the failing one first.

    The request goes as an operator record into the saga's partition, so the processor applies
    it in the saga's log order, fenced and deduplicated, and records who asked and why. Exit
    code 0 once applied; 1 when the replay failed again (nothing changed); 2 when refused; 3 when
    not sent, or not applied within ``--wait`` seconds.
    """
    from processor import cli_commands

    words = list(args.words)
    if not words or words == ["list"]:
        if args.json:
            from processor.ops.parked import list_parked

            with cli_commands.operator_queries(settings) as queries:
                _emit(args, list_parked(queries, limit=args.limit), "")
            return EXIT_OK
        return cli_commands.parked(args, settings)
    if words[0] not in ("retry", "skip") or len(words) != 3 or not args.reason:
        print("saga-processor: parked retry|skip SAGA_TYPE SAGA_ID --reason WHY", file=sys.stderr)
        return EXIT_REFUSED
    action = OperatorAction.PARKED_SKIP if words[0] == "skip" else OperatorAction.PARKED_RETRY
    args.saga_type, args.saga_id = words[1], words[2]
    sent_code = send(args, settings, action)
    if isinstance(sent_code, int):
        return sent_code
    with inspect_queries(settings) as queries:
        entry = wait_for_outcome(
            queries, args.saga_type, args.saga_id, sent_code.message_id, args.wait
        )
    if entry is None:
        print(
            f"saga-processor: {sent_code.message_id} sent; no processor applied it within "
            f"{args.wait:g} s (`show` lists it once applied)",
            file=sys.stderr,
        )
        return EXIT_NOT_SENT
    _emit(args, entry, f"{entry.outcome}: {entry.detail or ''}")
    return EXIT_OK if entry.outcome in ("applied", "duplicate") else EXIT_PROBLEM


# -- the web console ----------------------------------------------------------------------------


def console_arguments(parser: argparse.ArgumentParser) -> None:
    """`--host`, `--port`, `--enable-actions`."""
    parser.add_argument("--host", default=None, help="default: SAGA_CONSOLE__HOST (127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="default: SAGA_CONSOLE__PORT")
    parser.add_argument(
        "--enable-actions",
        action="store_true",
        help="show and accept actions; each needs SAGA_CONSOLE__TOKEN",
    )


def console(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Serves the console until interrupted; exit code 0, 2 when actions lack a token."""
    import uvicorn

    from processor.console import Backend, create_app

    token = settings.console.token.get_secret_value() if settings.console.token else None
    if args.enable_actions and not token:
        print("saga-processor: --enable-actions needs SAGA_CONSOLE__TOKEN", file=sys.stderr)
        return EXIT_REFUSED
    backend = Backend(settings, app=app_of(args))
    app = create_app(backend, actions=args.enable_actions, token=token)
    host = args.host or settings.console.host
    port = args.port if args.port is not None else settings.console.port
    print(f"saga console on http://{host}:{port}/", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
    return EXIT_OK
