"""One operator request sent, and the processor's outcome awaited: for every command that acts.

Requests go to the saga's input partition as operator records (see `processor._wire`), so they
run in log order with the saga's own events; exit codes are those of `processor._cli.inspect`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from processor._cli.commands import (
    Unavailable,
    adapters,
    emit,
    inspect_queries,
    operator_name,
    producer,
)
from processor._cli.inspect import EXIT_OK, EXIT_PROBLEM
from processor._wire import OperatorAction, OperatorRecord
from processor.ops._inspect import send_operator_request, wait_for_outcome
from processor.settings import ProcessorSettings

__all__ = ["operator_route", "request", "send", "wait_arguments"]


def operator_route(settings: ProcessorSettings) -> Callable[[str, bytes, int], int]:
    """Routes operator records to where the saga's events go now (input topics may grow)."""
    return adapters(settings).router()


def wait_arguments(parser: argparse.ArgumentParser, seconds: float = 30.0) -> None:
    """`--wait SECONDS` for the processor's outcome, or `--no-wait`."""
    parser.add_argument(
        "--wait",
        type=float,
        default=seconds,
        help=f"seconds to wait for a processor to apply the request (default {seconds:g})",
    )
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="return once the broker has the request; `show` lists its outcome later",
    )


def request(
    args: argparse.Namespace,
    settings: ProcessorSettings,
    action: OperatorAction,
    name: str | None = None,
    message: str | None = None,
) -> int:
    """Sends one operator request and, unless `--no-wait`, waits for the processor's outcome.

    Exit code 0 once applied (with `--no-wait`: once the broker has it); 1 when refused (a
    decision nothing waits for, no such saga, an ended saga, a replay that failed again) or
    when the saga's own code failed on it (the saga is parked), or when the processor
    dead-lettered it (a signature it did not accept: `RequestDeadLettered`); 3 when not sent, or
    not applied within `--wait` seconds.
    """
    sent = send(args, settings, action, name, message)
    if args.no_wait:
        emit(
            args,
            sent,
            f"{action} of {args.saga_type} {args.saga_id} sent as {sent.message_id}; "
            "`show` lists it once applied",
        )
        return EXIT_OK
    with inspect_queries(settings) as queries:
        entry = wait_for_outcome(queries, args.saga_type, args.saga_id, sent.message_id, args.wait)
    if entry is None:
        raise Unavailable(
            f"{sent.message_id} sent; no processor applied it within {args.wait:g} s (`show` "
            "lists it once applied)"
        )
    emit(args, entry, f"{entry.outcome}: {entry.detail or ''}")
    if entry.outcome in ("applied", "duplicate"):
        return EXIT_OK
    return EXIT_PROBLEM


def send(
    args: argparse.Namespace,
    settings: ProcessorSettings,
    action: OperatorAction,
    name: str | None = None,
    message: str | None = None,
) -> OperatorRecord:
    """Sends one operator request; the request once the broker has it.

    Raises:
        NotSent: The broker did not take it (`cli.main` exits 3).
    """
    from processor._runtime.assembly import operator_key

    with inspect_queries(settings) as queries, producer(settings) as out:
        return send_operator_request(
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
            message=message,
        )
