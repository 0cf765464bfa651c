"""What each `saga-processor` subcommand does: its arguments, and a handler returning its exit code.

Handlers assemble what they need from the settings (stores, bound sagas), call the operator
services of `processor.ops` or the runtime, and print the result. The database driver and the
runtime are imported only by the handlers that use them, so `diagram` and `lint-saga` work without
either. `processor.cli` lists the commands.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from processor.errors import SagaError
from processor.machine import MachineSpec, lint, mermaid
from processor.ops.deadlines import DeadlineRow, overdue_deadlines, pending_deadlines
from processor.ops.diagram import load_spec
from processor.ops.machines import MachineSummary, machine_summary
from processor.ops.outbox import discard_failed_rows, list_failed_rows, retry_failed_rows
from processor.ops.parked import RetryResult, list_parked, retry_parked_saga
from processor.ops.views import jsonable
from processor.settings import ProcessorSettings

if TYPE_CHECKING:
    from processor.application import SagaApp
    from processor.postgres.failed_outbox import PostgresFailedOutbox
    from processor.postgres.operator import OperatorQueries
    from processor.runtime.hooks import Hooks
    from processor.runtime.processor import Processor

log = logging.getLogger("processor")

Arguments = Callable[[argparse.ArgumentParser], None]
"""Adds a subcommand's own arguments to its parser."""
Run = Callable[[argparse.Namespace, ProcessorSettings], int]
"""Runs a subcommand; returns the process exit code."""
Offline = Callable[[argparse.Namespace], int]
"""Runs a subcommand that needs no configuration (no database, no broker)."""


# -- shared pieces -----------------------------------------------------------------------------


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """For commands configured by SAGA_* variables alone."""


def app_arguments(parser: argparse.ArgumentParser) -> None:
    """An optional MODULE:ATTR naming the application object (else `--app` or SAGA_APP)."""
    parser.add_argument(
        "target", metavar="MODULE:ATTR", nargs="?", default=None, help="the application object"
    )


def app_of(args: argparse.Namespace) -> SagaApp | None:
    """The application object the command line or SAGA_APP named, loaded by `cli.main`."""
    app: SagaApp | None = getattr(args, "saga_app", None)
    return app


def saga_key_arguments(parser: argparse.ArgumentParser) -> None:
    """The SAGA_TYPE SAGA_ID pair that names one saga instance."""
    parser.add_argument("saga_type", metavar="SAGA_TYPE")
    parser.add_argument("saga_id", metavar="SAGA_ID")


def limit_arguments(what: str) -> Arguments:
    """`--limit N` (default 100): at most N of `what`."""

    def add(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--limit", type=int, default=100, help=f"at most this many {what}")
        json_flag(parser)

    return add


def target_arguments(parser: argparse.ArgumentParser) -> None:
    """The MODULE:SAGA naming a state machine saga class, or MODULE:ATTR an app (+ `--saga`)."""
    parser.add_argument(
        "target",
        metavar="MODULE:SAGA|MODULE:ATTR",
        nargs="?",
        default=None,
        help="a state machine saga class, or the application object (default: SAGA_APP)",
    )
    parser.add_argument("--saga", default=None, help="with an app: the saga type or class name")
    json_flag(parser)


def spec_of(args: argparse.Namespace) -> MachineSpec:
    """The state machine the `diagram`/`lint-saga` target (or SAGA_APP) names."""
    from processor.application import app_target

    target = app_target(args.target)
    if target is None:
        raise SagaError("name the saga as MODULE:SAGA, or the app as MODULE:ATTR (or SAGA_APP)")
    return load_spec(target, args.saga)


def states_arguments(parser: argparse.ArgumentParser) -> None:
    """`--saga-type` narrows the state counts to one saga type; `--json`."""
    parser.add_argument("--saga-type", default=None, help="only this saga type")
    json_flag(parser)


def retry_arguments(parser: argparse.ArgumentParser) -> None:
    """SAGA_TYPE SAGA_ID; `--json`."""
    saga_key_arguments(parser)
    json_flag(parser)


def json_flag(parser: argparse.ArgumentParser) -> None:
    """Adds `--json` to a command."""
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """Prints ``data`` as one JSON document with `--json`, else ``text``."""
    if getattr(args, "json", False):
        json.dump(jsonable(data), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print(text)


def text_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Fixed-width columns, two spaces apart, header first; no trailing blanks."""
    cells = [tuple(header), *(tuple(r) for r in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def operator_name(settings: ProcessorSettings) -> str:
    """Who is asking: `SAGA_OPERATOR__NAME`, else the OS user (recorded in the audit trail)."""
    return settings.operator.name or getpass.getuser()


def operator_queries(settings: ProcessorSettings) -> OperatorQueries:
    """Operator queries on an autocommit connection of their own, over the processor's tables."""
    from processor.postgres.operator import open_operator_queries
    from processor.runtime.assembly import tables_for

    return open_operator_queries(settings.database.url.get_secret_value(), tables_for(settings))


# -- the processor -----------------------------------------------------------------------------


EXIT_LOOP_DIED = 70
"""Exit code of `run` when a loop of the processor died (EX_SOFTWARE): restart the process."""


def run(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Runs the processor until SIGTERM or SIGINT.

    Exit code 0 after a clean stop; :data:`EXIT_LOOP_DIED` (70) when the consumer, the relay,
    its listener or the deadline poller died on an error (logged with its traceback), so that
    the platform restarts the process; 3 when a shutdown overran ``SAGA_SHUTDOWN_TIMEOUT`` (or a
    second signal came); 1, after a dump of every thread's stack, when no Python thread could
    run 5 s past it (see :mod:`processor.runtime.stopping`).
    """
    return run_processor(settings, app_of(args))


def run_processor(
    settings: ProcessorSettings, app: SagaApp | None, hooks: Hooks | None = None
) -> int:
    """Builds the app's dependencies and runs the processor until it stops; see :func:`run`."""
    from processor.participant.serve import hosted
    from processor.runtime.assembly import open_sagas
    from processor.runtime.processor import Processor
    from processor.runtime.stopping import exit_now

    # The app's dependencies are built once for the process and closed after the processor
    # stopped (on SIGTERM too: serve() returns once the processor has shut down).
    with open_sagas(settings, app) as (saga_classes, dependencies):
        proc = Processor(settings, saga_classes, dependencies=dependencies, hooks=hooks)
        guests = app.hosted() if app is not None else None
        with hosted(settings, guests, dependencies, proc.stop) as participants:
            code = serve(proc, settings)
            # A hosted participant loop that died stopped the processor: restart the process.
            supervisor = participants.supervisor if participants is not None else None
            if supervisor is not None and supervisor.failure is not None:
                code = EXIT_LOOP_DIED
        if participants is not None and participants.left_running:
            proc.left_running.extend(participants.left_running)
    if proc.left_running:
        # A close still waits on the broker; the interpreter's finalisation would wait on it.
        exit_now(code)
    return code


def serve(proc: Processor, settings: ProcessorSettings) -> int:
    """Starts ``proc``, stops it on SIGTERM or SIGINT, and returns the process exit code.

    The stop is bounded however it begins (a signal, or a loop that died): see
    :class:`processor.runtime.stopping.ShutdownBound`.
    """
    from processor.errors import LoopDied
    from processor.runtime.stopping import ShutdownBound, on_stop_signals

    bound = ShutdownBound(settings.shutdown_timeout.total_seconds())
    proc.start()
    on_stop_signals(proc.stop, bound)
    bound.watch(proc.stop_event)
    try:
        proc.run()
    except LoopDied as e:
        print(f"saga-processor: {e}", file=sys.stderr)
        return EXIT_LOOP_DIED
    return 0


# -- deadlines ---------------------------------------------------------------------------------

_DEADLINE_HEADER = (
    "ID",
    "SAGA TYPE",
    "SAGA ID",
    "NAME",
    "DUE AT",
    "DISPATCHED AT",
    "TOKEN",
    "PAYLOAD",
)


def format_deadlines(rows: Sequence[DeadlineRow]) -> str:
    """Renders deadlines as a fixed-width text table, header first."""
    return text_table(
        _DEADLINE_HEADER,
        (
            (
                r.id,
                r.saga_type,
                r.saga_id,
                r.name,
                r.due_at.isoformat(),
                r.dispatched_at.isoformat() if r.dispatched_at else "-",
                str(r.dispatch_token) if r.dispatch_token is not None else "-",
                json.dumps(r.payload, sort_keys=True) if r.payload is not None else "-",
            )
            for r in rows
        ),
    )


def deadlines(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Prints one saga's pending deadlines; exit code 0 even when there are none."""
    with operator_queries(settings) as queries:
        rows = pending_deadlines(queries, args.saga_type, args.saga_id)
    print(
        format_deadlines(rows)
        if rows
        else f"no deadlines scheduled for {args.saga_type} {args.saga_id}"
    )
    return 0


def overdue(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Prints overdue deadlines, oldest due first; exit code 0."""
    with operator_queries(settings) as queries:
        rows = overdue_deadlines(queries, limit=args.limit)
    emit(args, rows, format_deadlines(rows) if rows else "no overdue deadlines")
    return 0


# -- state machines ----------------------------------------------------------------------------


def diagram(args: argparse.Namespace) -> int:
    """Prints the Mermaid ``stateDiagram-v2`` of the saga; exit code 0."""
    text = mermaid(spec_of(args))
    if args.json:
        emit(args, {"format": "mermaid", "diagram": text}, "")
    else:
        sys.stdout.write(text)
    return 0


def lint_saga(args: argparse.Namespace) -> int:
    """Prints the machine's problems; exit code 1 when there are any."""
    problems = lint(spec_of(args))
    text = "\n".join(problems) or f"{args.target or 'the app'}: no problems found"
    emit(args, {"ok": not problems, "problems": problems}, text)
    return 1 if problems else 0


def format_summary(summary: MachineSummary) -> str:
    """Renders the summary as a fixed-width table followed by the attention totals."""
    table = text_table(
        ("SAGA TYPE", "MACHINE STATE", "COUNT", "OLDEST"),
        (
            (r.saga_type, r.machine_state, str(r.count), str(r.oldest).split(".")[0])
            for r in summary.states
        ),
    )
    totals = f"TIMED_OUT: {summary.timed_out}  COMPENSATION_FAILED: {summary.compensation_failed}"
    return f"{table}\n{totals}"


def states(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Prints sagas per machine state with the age of the oldest; exit code 0."""
    with operator_queries(settings) as queries:
        summary = machine_summary(queries, args.saga_type)
    emit(args, summary, format_summary(summary))
    return 0


# -- parked sagas ------------------------------------------------------------------------------


def retry(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Exit code 0 when the saga flows again, 1 when a message failed again (nothing changed)."""
    result = retry_from_settings(settings, args.saga_type, args.saga_id, app=app_of(args))
    if args.json:
        emit(args, result, "")
        return 1 if result.failure is not None else 0
    for o in result.outcomes:
        where = f"{o.topic}[{o.partition}]@{o.offset}"
        version = f" v{o.version}" if o.version is not None else ""
        print(f"{o.outcome:<14} {o.message_type} {o.message_id} {where}{version}")
    if result.failure is not None:
        f = result.failure
        print(
            f"retry failed at held message {f.parked_id} ({f.topic}[{f.partition}]@{f.offset}, "
            f"message-id {f.message_id}): {f.reason}; the saga stays parked, nothing changed",
            file=sys.stderr,
        )
        return 1
    print(
        f"saga {result.saga_type} {result.saga_id}: {result.held} held messages replayed, "
        f"now {result.status}"
    )
    return 0


def retry_from_settings(
    settings: ProcessorSettings,
    saga_type: str,
    saga_id: str,
    *,
    app: SagaApp | None = None,
    skip: int = 0,
    by: str | None = None,
    reason: str | None = None,
) -> RetryResult:
    """Retries a parked saga with the app's sagas and dependencies (else `settings.sagas`).

    ``skip``, ``by`` and ``reason`` are those of :func:`processor.ops.parked.retry_parked_saga`.

    The sagas are bound as the processor binds them; the app's dependency factories run once
    and are closed when the retry is over.
    """
    from processor.runtime.assembly import bind_sagas, open_sagas

    with (
        open_sagas(settings, app) as (saga_classes, dependencies),
        operator_queries(settings) as queries,
    ):
        bound = bind_sagas(settings, saga_classes, dependencies=dependencies)
        return retry_parked_saga(
            queries,
            bound.planner,
            saga_type,
            saga_id,
            registry=bound.registry,
            max_record_bytes=settings.consumer.max_record_bytes,
            skip=skip,
            by=by,
            reason=reason,
        )


def parked(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Prints parked sagas, longest parked first, then sagas waiting on a person; exit code 0."""
    from processor.cli_inspect import inspect_queries
    from processor.engine.output import WAITING_ON_A_PERSON

    with operator_queries(settings) as queries:
        rows = list_parked(queries, limit=args.limit)
    with inspect_queries(settings) as looks:
        waiting = [
            s
            for s in looks.list_sagas(status="active", machine_state="WAITING", limit=args.limit)
            if (s.parked_reason or "").startswith(WAITING_ON_A_PERSON)
        ]
    if not rows and not waiting:
        print("no parked sagas")
        return 0
    if rows:
        print(
            text_table(
                ("SAGA TYPE", "SAGA ID", "HELD", "PARKED SINCE", "REASON"),
                (
                    (r.saga_type, r.saga_id, str(r.held), r.parked_at.isoformat(), r.reason or "-")
                    for r in rows
                ),
            )
        )
    if waiting:
        # Not parked (their events still flow), but stopped until a person decides.
        print(("\n" if rows else "") + "waiting on a person (saga resolve TYPE ID DECISION):")
        print(
            text_table(
                ("SAGA TYPE", "SAGA ID", "WAITING SINCE", "WHY"),
                (
                    (
                        s.saga_type,
                        s.saga_id,
                        s.since.isoformat(),
                        (s.parked_reason or "").removeprefix(WAITING_ON_A_PERSON),
                    )
                    for s in waiting
                ),
            )
        )
    return 0


# -- the failed outbox -------------------------------------------------------------------------


def outbox_arguments(parser: argparse.ArgumentParser) -> None:
    """`failed list|retry|discard`, each selecting by `--saga-type/--saga-id` or `--id`."""
    what = parser.add_subparsers(dest="outbox_what", required=True)
    failed = what.add_parser("failed", help="rows the relay could not publish, and rows held")
    actions = failed.add_subparsers(dest="action", required=True)
    for name, help_ in (
        ("list", "list failed and held rows in their original order"),
        ("retry", "put a saga's failed and held rows back into the outbox, in order"),
        ("discard", "delete failed rows for good, with a reason"),
    ):
        sub = actions.add_parser(name, help=help_)
        sub.add_argument("--saga-type", default=None, help="the saga type")
        sub.add_argument("--saga-id", default=None, help="the saga id (with --saga-type)")
        if name == "list":
            sub.add_argument("--limit", type=int, default=100, help="at most this many rows")
        else:
            sub.add_argument("--id", dest="row_id", type=int, default=None, help="one row's id")
        if name == "discard":
            sub.add_argument(
                "--reason", required=True, help="why; logged with every row and audited"
            )
        elif name == "retry":
            sub.add_argument("--reason", default=None, help="why; recorded in the audit trail")
        sub.add_argument(
            "--json", action="store_true", help="print one JSON document: the action and its rows"
        )


@contextmanager
def failed_outbox(settings: ProcessorSettings) -> Iterator[PostgresFailedOutbox]:
    """The failed outbox on an autocommit connection of its own, closed on leaving."""
    from processor.postgres.connect import connect
    from processor.postgres.failed_outbox import PostgresFailedOutbox
    from processor.runtime.assembly import tables_for

    with connect(settings.database.url.get_secret_value(), autocommit=True) as conn:
        yield PostgresFailedOutbox(conn, tables_for(settings))


def outbox(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Lists, retries or discards failed outbox rows; exit code 0, 1 when nothing matches.

    A retry or discard is recorded in the audit trail with the rows it moved, in their
    transaction.
    """
    with failed_outbox(settings) as store:
        if args.action == "list":
            rows = list_failed_rows(
                store, saga_type=args.saga_type, saga_id=args.saga_id, limit=args.limit
            )
        elif args.action == "retry":
            rows = retry_failed_rows(
                store,
                saga_type=args.saga_type,
                saga_id=args.saga_id,
                row_id=args.row_id,
                actor=operator_name(settings),
                reason=args.reason,
            )
        else:
            rows = discard_failed_rows(
                store,
                reason=args.reason,
                saga_type=args.saga_type,
                saga_id=args.saga_id,
                row_id=args.row_id,
                actor=operator_name(settings),
            )
    if args.json:
        from processor.ops.views import jsonable

        document = {"action": args.action, "rows": jsonable(rows)}
        json.dump(document, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    if not rows:
        print("no failed outbox rows")
        return 0
    if args.action != "list":
        done = "put back into the outbox" if args.action == "retry" else "discarded"
        print(f"{len(rows)} rows {done}:")
    print(
        text_table(
            (
                "ID",
                "SAGA TYPE",
                "SAGA ID",
                "MESSAGE ID",
                "TOPIC",
                "BYTES",
                "ATTEMPTS",
                "FAILED AT",
                "REASON",
            ),
            (
                (
                    str(r.id),
                    r.row.saga_type or "-",
                    r.row.saga_id or "-",
                    r.row.headers.get("message-id", "-"),
                    r.row.topic,
                    str(r.value_bytes),
                    str(r.attempts),
                    r.failed_at.isoformat(),
                    r.reason,
                )
                for r in rows
            ),
        )
    )
    return 0
