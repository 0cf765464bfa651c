"""`saga cancel|terminate|retry|resolve`: their arguments, and the batch form, `--where KEY=VALUE`.

The batch form acts on every saga its filters match. The selection, the sending and the wait are
:mod:`processor.ops._batch`'s (the console's batch form runs the same); this module reads the
command line, asks for a confirmation and prints progress. Exit codes: 0 every request applied
(with ``--no-wait``: sent; with ``--dry-run``: listed); 1 no saga matches, or some request was
refused, ignored or dead-lettered; 2 a usage mistake, or a batch over ``--confirm-over`` that was
not confirmed; 3 some request was not sent, or not decided within ``--wait`` (3 wins over 1: the
batch is not finished).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from processor._cli.commands import (
    emit,
    inspect_queries,
    json_flag,
    operator_name,
    producer,
    text_table,
)
from processor._cli.inspect import EXIT_NOT_SENT, EXIT_OK, EXIT_PROBLEM, EXIT_USAGE
from processor._errors import Refused, SagaError
from processor.ops._batch import (
    CONFIRM_OVER,
    LIMIT,
    Selection,
    confirmation,
    confirmed,
    parse_where,
    select,
    send_batch,
    tally,
    wait_for_batch,
)
from processor.ops._filters import age_text
from processor.settings import ProcessorSettings

__all__ = ["batch", "batch_arguments", "check_single", "saga_action_parsers"]


def saga_action_parsers(what: Any) -> None:
    """`saga cancel|terminate|retry|resolve`: one saga (SAGA_TYPE SAGA_ID) or ``--where``.

    ``what`` is the `saga` command's subparsers (argparse's private `_SubParsersAction`).
    """
    cancel = what.add_parser("cancel", help="run the saga's cancel (compensation) path")
    terminate = what.add_parser(
        "terminate", help="end the saga without compensation (needs --force)"
    )
    terminate.add_argument(
        "--force",
        action="store_true",
        help="confirm: nothing done so far is undone; the history says so",
    )
    retry = what.add_parser(
        "retry", help="replay a parked saga's held messages, as `parked retry` does"
    )
    resolve = what.add_parser(
        "resolve", help="a person's decision for a saga waiting on one (retry, skip, compensate)"
    )
    for sub in (cancel, terminate, retry, resolve):
        # Optional: `--where` selects the sagas instead (`check_single` and `batch` decide).
        sub.add_argument("saga_type", metavar="SAGA_TYPE", nargs="?")
        sub.add_argument("saga_id", metavar="SAGA_ID", nargs="?")
    resolve.add_argument(
        "decision",
        nargs="?",
        help="retry, skip or compensate for an orchestrated saga's escalated step (retry or skip "
        "for an escalated undo: skip means it was undone by hand); what a plain saga's "
        "@saga_decision_handler understands otherwise",
    )
    for sub in (cancel, terminate, retry, resolve):
        # Checked by hand: a dry run needs no reason.
        sub.add_argument("--reason", default=None, help="why (required but for --dry-run)")
        batch_arguments(sub, decision=sub is resolve)
        json_flag(sub)


def batch_arguments(parser: argparse.ArgumentParser, decision: bool = False) -> None:
    """`--where`, `--dry-run`, `--yes`, `--confirm-over`, `--limit`, `--wait`, `--no-wait`.

    ``decision``: the parser is resolve's, which takes ``--decision`` too.
    """
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="instead of SAGA_TYPE SAGA_ID: every saga matching all these filters (repeat): "
        "type, status, state (machine state), outcome, correlation (or correlation_id), attr "
        "(the state search: attr=customer_id=c-7), older_than (or age: unchanged for, e.g. 2h). "
        "Without status, cancel, terminate and resolve touch only sagas that have not ended; "
        "retry touches parked sagas only",
    )
    if decision:
        parser.add_argument(
            "--decision",
            dest="decision_option",
            default=None,
            help="the decision (retry, skip, compensate, ...): for --where, or instead of DECISION",
        )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="with --where: list the sagas it would touch (type, id, status, state, age) and "
        "their count; send nothing",
    )
    parser.add_argument(
        "--yes",
        action="store_true",
        help="with --where: go on without asking when more than --confirm-over sagas match",
    )
    parser.add_argument(
        "--confirm-over",
        type=int,
        default=None,
        metavar="N",
        help=f"with --where: more than N matching sagas (default {CONFIRM_OVER}) ask for the "
        "count on a terminal, and are refused elsewhere unless --yes",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help=f"with --where: at most this many sagas, least recently changed first (default "
        f"{LIMIT}; says so when more match)",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=None,
        help="seconds to wait for the processor's outcome (default 30, 60 for retry; for "
        "--where 60 plus one per 50 sagas)",
    )
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="return once the broker has the request(s); `show` (`audit list --batch ID` for "
        "a batch) lists the outcomes later",
    )


def check_single(args: argparse.Namespace) -> None:
    """Checks the one-saga form, `saga ACTION SAGA_TYPE SAGA_ID ... --reason WHY`.

    Sets the default ``--wait`` and, for resolve, the decision from DECISION or ``--decision``.

    Raises:
        SagaError: No saga named, an option that goes with ``--where`` only, no reason, or a
            resolve without (or with two different) decisions.
    """
    if not (args.saga_type and args.saga_id):
        raise SagaError(
            f"saga {args.action} SAGA_TYPE SAGA_ID --reason WHY, or select sagas with "
            "--where KEY=VALUE"
        )
    given = (
        ("--dry-run", args.dry_run),
        ("--yes", args.yes),
        ("--confirm-over", args.confirm_over is not None),
        ("--limit", args.limit is not None),
    )
    extra = [name for name, on in given if on]
    if extra:
        raise SagaError(f"{', '.join(extra)} go with --where, not with one saga")
    if not (args.reason or "").strip():
        raise SagaError("--reason WHY is required")
    if args.action == "resolve":
        positional, option = args.decision, args.decision_option
        if positional and option and positional != option:
            raise SagaError("two decisions: give DECISION or --decision, not both")
        args.decision = positional or option
        if not args.decision:
            raise SagaError("saga resolve SAGA_TYPE SAGA_ID DECISION --reason WHY")
    if args.wait is None:
        args.wait = 60.0 if args.action == "retry" else 30.0


def batch(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """`saga ACTION --where KEY=VALUE ... --reason WHY`: the action on every matching saga.

    Lists them with ``--dry-run``; else asks for a confirmation over ``--confirm-over``, records
    the batch, sends one request per saga (``sent n of N`` every 100) and, unless ``--no-wait``,
    waits for the processor's outcomes (``applied n of N``), then prints the counts per outcome.
    """
    from processor._cli.requests import operator_route
    from processor._runtime.assembly import operator_key

    if args.saga_type is not None:
        raise SagaError("name one saga (SAGA_TYPE SAGA_ID) or select sagas with --where, not both")
    decision = getattr(args, "decision_option", None)
    if args.action == "resolve" and not decision and not args.dry_run:
        raise SagaError("saga resolve --where ... needs --decision retry|skip|compensate")
    if not args.dry_run and not (args.reason or "").strip():
        raise SagaError("--reason WHY is required")
    key = operator_key(settings)
    if key is None and not args.dry_run:
        # Before asking anyone to confirm what could not be sent.
        raise SagaError("no operator key: set SAGA_OPERATOR__KEY to the processor's key")
    where = parse_where(args.where)
    over = args.confirm_over if args.confirm_over is not None else CONFIRM_OVER
    with inspect_queries(settings) as queries:
        chosen = select(queries, args.action, where, LIMIT if args.limit is None else args.limit)
        if args.dry_run:
            return _dry_run(args, chosen)
        n = len(chosen.sagas)
        if not n:
            raise Refused("no saga matches: nothing sent")
        if chosen.capped:
            print(
                f"more sagas match than --limit {chosen.limit}: only the first {n} (least "
                "recently changed) are touched",
                file=sys.stderr,
            )
        decided = confirmation(n, over, yes=args.yes, interactive=sys.stdin.isatty())
        if decided == "refuse":
            raise SagaError(
                f"{n} sagas match, more than --confirm-over {over}: add --yes to go on "
                "(--dry-run lists them)"
            )
        if decided == "ask" and not _ask(n):
            print("not confirmed: nothing sent", file=sys.stderr)
            return EXIT_USAGE
        progress = not args.json
        with producer(settings) as out:
            sent = send_batch(
                queries,
                out,
                key,
                chosen,
                by=operator_name(settings),
                reason=args.reason,
                decision=decision,
                route=operator_route(settings),
                progress=_counter("sent") if progress else None,
            )
        for failed in sent.not_sent:
            what = f"{failed['saga_type']} {failed['saga_id']}"
            print(f"not sent: {what}: {failed['error']}", file=sys.stderr)
        outcomes: dict[tuple[str, str], str] = {}
        if not args.no_wait and sent.sent:
            wait = args.wait if args.wait is not None else 60.0 + len(sent.sent) / 50
            show = _applied if progress else None
            outcomes = wait_for_batch(queries, sent, wait, show)
    counts = {} if args.no_wait else tally(sent, outcomes)
    if args.no_wait and sent.not_sent:
        counts = {"not sent": len(sent.not_sent)}
    document = {
        "batch": sent.batch,
        "action": sent.action,
        "where": dict(chosen.where),
        "matched": n,
        "capped": chosen.capped,
        "sent": len(sent.sent),
        "not_sent": sent.not_sent,
        "outcomes": counts,
        "requests": [
            {
                "saga_type": s.saga_type,
                "saga_id": s.saga_id,
                "message_id": s.message_id,
                "outcome": outcomes.get((s.saga_type, s.saga_id)),
            }
            for s in sent.sent
        ],
    }
    said = ", ".join(f"{c} {o}" for o, c in counts.items())
    text = (
        f"batch {sent.batch}: {sent.action} sent to {len(sent.sent)} of {n} sagas"
        + (f" ({said})" if said else "")
        + f"; `audit list --batch {sent.batch}` lists the outcomes"
        if args.no_wait
        else f"batch {sent.batch}: {sent.action} of {n} sagas: {said}"
    )
    emit(args, document, text)
    if sent.not_sent or (len(outcomes) < len(sent.sent) and not args.no_wait):
        return EXIT_NOT_SENT
    if any(o != "applied" for o in outcomes.values()):
        return EXIT_PROBLEM
    return EXIT_OK


def _dry_run(args: argparse.Namespace, chosen: Selection) -> int:
    now = datetime.now(UTC)
    rows: list[dict[str, Any]] = [
        {
            "saga_type": s.saga_type,
            "saga_id": s.saga_id,
            "status": s.status,
            "state": s.machine_state,
            "updated_at": s.updated_at,
            "age_seconds": round((now - s.updated_at).total_seconds(), 3),
        }
        for s in chosen.sagas
    ]
    n = len(rows)
    table = text_table(
        ("SAGA TYPE", "SAGA ID", "STATUS", "STATE", "AGE"),
        (
            (
                r["saga_type"],
                r["saga_id"],
                r["status"],
                r["state"] or "-",
                age_text(r["age_seconds"]),
            )
            for r in rows
        ),
    )
    text = (table + "\n" if rows else "") + (
        f"{n} saga{'s match' if n != 1 else ' matches'}: `saga {args.action}` would touch "
        f"{'them' if n != 1 else 'it'} (dry run: nothing sent)"
    )
    if chosen.capped:
        text += f"\nmore match than --limit {chosen.limit}: only these would be touched"
    document = {
        "dry_run": True,
        "action": chosen.action,
        "where": dict(chosen.where),
        "matched": n,
        "capped": chosen.capped,
        "limit": chosen.limit,
        "sagas": rows,
    }
    emit(args, document, text)
    return EXIT_OK


def _ask(n: int) -> bool:
    """Asks the person at the terminal to type the count back (on stderr: stdout is the answer)."""
    sys.stderr.write(f"{n} sagas match; type the count to go on: ")
    sys.stderr.flush()
    return confirmed(sys.stdin.readline(), n)


def _counter(what: str) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        print(f"{what} {done} of {total}", flush=True)

    return report


def _applied(outcomes: Mapping[tuple[str, str], str], total: int) -> None:
    applied = sum(1 for o in outcomes.values() if o == "applied")
    others = len(outcomes) - applied
    refused = f" ({others} not applied)" if others else ""
    print(f"applied {applied} of {total}{refused}", flush=True)
