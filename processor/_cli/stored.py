"""The commands over what the processor stored: deadlines, states, parked sagas, failed outbox.

Each reads or changes the database through the operator services of `processor.ops`, over
adapters from :mod:`processor._bootstrap`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from processor._cli.commands import (
    adapters,
    app_of,
    emit,
    operator_name,
    operator_queries,
    text_table,
)
from processor._ports import FailedOutboxStore
from processor._wire import HEADER_MESSAGE_ID
from processor.ops._deadlines import DeadlineRow, overdue_deadlines, pending_deadlines
from processor.ops._machines import MachineSummary, machine_summary
from processor.ops._outbox import discard_failed_rows, list_failed_rows, retry_failed_rows
from processor.ops._parked import RetryResult, list_parked, retry_parked_saga
from processor.settings import ProcessorSettings

if TYPE_CHECKING:
    from processor._authoring.application import SagaApp


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


# -- machine states --------------------------------------------------------------------------


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

    ``skip``, ``by`` and ``reason`` are those of :func:`processor.ops._parked.retry_parked_saga`.

    The sagas are bound as the processor binds them; the app's dependency factories run once
    and are closed when the retry is over.
    """
    from processor._runtime.assembly import bind_sagas, open_sagas

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
    from processor._cli.commands import inspect_queries
    from processor._engine.output import WAITING_ON_A_PERSON

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
def failed_outbox(settings: ProcessorSettings) -> Iterator[FailedOutboxStore]:
    """The failed outbox on an autocommit connection of its own, closed on leaving."""
    with adapters(settings).failed_outbox() as store:
        yield store


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
        from processor._ports.views import jsonable

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
                    r.row.headers.get(HEADER_MESSAGE_ID, "-"),
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
