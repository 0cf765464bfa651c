"""Operator commands that act: `saga cancel`, deadline and parked actions, the web console.

Requests go to the saga's input partition as operator records (see `processor._wire`), so they
run in log order with the saga's own events; exit codes are those of `processor._cli.inspect`.
The processor records each request it decides in the audit trail (`audit list`), with the
operator's name (`SAGA_OPERATOR__NAME`, else the OS user).
"""

from __future__ import annotations

import argparse
import logging
import sys
from types import FrameType

from processor._cli.commands import (
    app_of,
    emit,
    inspect_queries,
    json_flag,
    operator_name,
    operator_queries,
    producer,
)
from processor._cli.inspect import EXIT_NOT_SENT, EXIT_OK, EXIT_USAGE
from processor._cli.requests import operator_route, request, wait_arguments
from processor._errors import SagaError
from processor._wire import OperatorAction
from processor.ops._inspect import NotSent, OperatorRefused, send_operator_request
from processor.settings import ProcessorSettings

log = logging.getLogger(__name__)


def saga_arguments(parser: argparse.ArgumentParser) -> None:
    """`cancel|terminate|retry|resolve SAGA_TYPE SAGA_ID ... --reason` (or `--where ...`)."""
    what = parser.add_subparsers(dest="action", required=True)
    from processor._cli.batch import saga_action_parsers

    saga_action_parsers(what)
    from processor._cli.inject import inject_arguments

    inject_arguments(what.add_parser("inject", help="deliver an event to the saga by hand"))
    from processor._cli.reset import reset_arguments

    reset_arguments(what.add_parser("reset", help="go back before one input and replay from there"))


def saga(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """`saga cancel|terminate|retry|resolve`: sends the request and waits for its outcome.

    With `--where`, the action on every matching saga (`processor._cli.batch`). Exit code 0 once
    applied; 1 when refused (a decision nothing waits for, no such saga, an ended saga) or the
    saga's own code failed on it (the saga is parked); 2 for ``terminate`` without ``--force``
    (nothing is sent); 3 when not sent, or not applied within ``--wait`` seconds.
    """
    if args.action == "inject":
        from processor._cli.inject import inject

        return inject(args, settings)
    if args.action == "reset":
        from processor._cli.reset import reset

        return reset(args, settings)
    if args.action == "terminate" and not args.force and not args.dry_run:
        raise SagaError(
            "terminate ends the saga without compensation: whatever it did stays done. Use "
            "`saga cancel` to undo it, or pass --force to terminate anyway"
        )
    from processor._cli.batch import batch, check_single

    if args.where:
        return batch(args, settings)
    check_single(args)
    action = {
        "cancel": OperatorAction.CANCEL,
        "terminate": OperatorAction.TERMINATE,
        "retry": OperatorAction.PARKED_RETRY,
        "resolve": OperatorAction.RESOLVE,
    }[args.action]
    return request(args, settings, action, getattr(args, "decision", None))


def deadline_arguments(parser: argparse.ArgumentParser) -> None:
    """`deadlines SAGA_TYPE SAGA_ID` lists; `deadlines fire-now|cancel T ID NAME --reason`."""
    parser.add_argument("words", nargs="+", metavar="[fire-now|cancel] SAGA_TYPE SAGA_ID [NAME]")
    parser.add_argument("--reason", default=None, help="why (required for fire-now and cancel)")
    wait_arguments(parser)
    json_flag(parser)


def deadlines(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Lists a saga's deadlines, or sends a fire-now or cancel request for one."""
    from processor._cli import stored

    words = list(args.words)
    if words[0] in ("fire-now", "cancel"):
        if len(words) != 4 or not args.reason:
            raise SagaError("deadlines fire-now|cancel SAGA_TYPE SAGA_ID NAME --reason WHY")
        args.saga_type, args.saga_id, name = words[1:]
        action = (
            OperatorAction.DEADLINE_FIRE_NOW
            if words[0] == "fire-now"
            else OperatorAction.DEADLINE_CANCEL
        )
        return request(args, settings, action, name)
    if len(words) != 2:
        raise SagaError("deadlines SAGA_TYPE SAGA_ID")
    args.saga_type, args.saga_id = words
    if args.json:
        with inspect_queries(settings) as queries:
            rows = queries.deadlines(args.saga_type, args.saga_id)
        emit(args, rows, "")
        return EXIT_OK
    return stored.deadlines(args, settings)


def parked_arguments(parser: argparse.ArgumentParser) -> None:
    """`parked` lists; `parked retry|skip SAGA_TYPE SAGA_ID --reason`; `parked retry --all`."""
    parser.add_argument("words", nargs="*", metavar="[retry|skip SAGA_TYPE SAGA_ID]")
    parser.add_argument("--limit", type=int, default=100, help="at most this many sagas")
    parser.add_argument("--reason", default=None, help="why (required for retry and skip)")
    parser.add_argument(
        "--all", action="store_true", help="retry every parked saga (narrowed by the options below)"
    )
    parser.add_argument("--saga-type", dest="only_type", default=None, help="with --all: only T")
    parser.add_argument(
        "--since",
        default=None,
        help="with --all: only sagas parked at most this long ago (e.g. 2h, 30m, 1d)",
    )
    parser.add_argument(
        "--parked-for",
        dest="parked_for",
        default=None,
        help="with --all: only sagas whose parked reason contains this text",
    )
    wait_arguments(parser, 60.0)
    json_flag(parser)


def parked(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Lists parked sagas, or asks the processor to retry (or skip) one and waits for it.

    A retry replays the held messages; a skip drops the failing one first.

    The request goes as an operator record into the saga's partition, so the processor applies
    it in the saga's log order, fenced and deduplicated, and records who asked and why (in the
    history and the audit trail). Exit code 0 once applied (with ``--no-wait``: once sent); 1
    when refused (the replay failed again: nothing changed); 2 for a usage mistake; 3 when not
    sent, or not applied within ``--wait`` seconds.
    """
    from processor._cli import stored

    words = list(args.words)
    if not words or words == ["list"]:
        if args.json:
            from processor.ops._parked import list_parked

            with operator_queries(settings) as queries:
                emit(args, list_parked(queries, limit=args.limit), "")
            return EXIT_OK
        return stored.parked(args, settings)
    if words == ["retry"] and args.all:
        return retry_all(args, settings)
    if words[0] not in ("retry", "skip") or len(words) != 3 or not args.reason:
        raise SagaError("parked retry|skip SAGA_TYPE SAGA_ID --reason WHY")
    action = OperatorAction.PARKED_SKIP if words[0] == "skip" else OperatorAction.PARKED_RETRY
    args.saga_type, args.saga_id = words[1], words[2]
    return request(args, settings, action)


def retry_all(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """`parked retry --all --reason WHY [--saga-type T] [--since AGE] [--parked-for TEXT]`.

    Sends one retry request per matching parked saga into its partition (the processor replays
    each in its log order, as for a single retry) and reports progress; it does not wait for
    the outcomes: `parked` lists what is still parked. Exit code 0 when every request was sent,
    2 for a usage mistake, 3 when some were not sent. With ``--json`` the progress lines are
    left out and one document says what was sent.
    """
    from datetime import UTC, datetime

    from pydantic import TypeAdapter, ValidationError

    from processor._runtime.assembly import operator_key
    from processor.settings import Duration

    if not args.reason:
        raise SagaError("parked retry --all needs --reason WHY")
    try:
        since = TypeAdapter(Duration).validate_python(args.since) if args.since else None
    except ValidationError:
        raise SagaError(f"--since {args.since!r} is not a duration (e.g. 2h)") from None
    with operator_queries(settings) as queries:
        found = queries.parked_sagas(1_000_000)
    now = datetime.now(UTC)
    chosen = [
        p
        for p in found
        if (args.only_type is None or p.saga_type == args.only_type)
        and (since is None or p.parked_at is None or now - p.parked_at <= since)
        and (args.parked_for is None or args.parked_for in (p.reason or ""))
    ]
    progress = not args.json
    if progress:
        print(f"{len(chosen)} of {len(found)} parked sagas match", flush=True)
    sent: list[dict[str, str]] = []
    failed: list[dict[str, str]] = []
    key, by, route = operator_key(settings), operator_name(settings), operator_route(settings)
    with inspect_queries(settings) as inspect, producer(settings) as out:
        for n, p in enumerate(chosen, start=1):
            saga = {"saga_type": p.saga_type, "saga_id": p.saga_id}
            try:
                record = send_operator_request(
                    inspect,
                    out,
                    key,
                    action=OperatorAction.PARKED_RETRY,
                    saga_type=p.saga_type,
                    saga_id=p.saga_id,
                    by=by,
                    reason=args.reason,
                    route=route,
                )
                sent.append({**saga, "message_id": record.message_id})
            except OperatorRefused as e:
                if not isinstance(e, NotSent) and "no event on record" not in str(e):
                    raise
                failed.append({**saga, "error": str(e)})
                print(f"not sent: {p.saga_type} {p.saga_id}: {e}", file=sys.stderr)
            if progress and (n % 100 == 0 or n == len(chosen)):
                print(f"sent {len(sent)} of {len(chosen)} retry requests", flush=True)
    emit(
        args,
        {"parked": len(found), "matched": len(chosen), "sent": sent, "not_sent": failed},
        f"sent {len(sent)} retry request(s), {len(failed)} not sent; `saga-processor parked` "
        "lists the sagas still parked once the processors applied them",
    )
    return EXIT_OK if not failed else EXIT_NOT_SENT


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

    from processor._console import Backend, create_app
    from processor._console.auth import Authenticator
    from processor._console.serve import server_config
    from processor._errors import ConfigurationError
    from processor._runtime.stopping import ShutdownBound

    cs = settings.console
    token = cs.token.get_secret_value() if cs.token else None
    try:
        auth = Authenticator(
            keys={n: (o.key.get_secret_value(), o.role) for n, o in cs.operators.items()},
            trusted_proxies=cs.trusted_proxies,
            user_header=cs.user_header,
            proxy_roles=cs.roles,
            proxy_role=cs.proxy_role,
            anonymous=cs.anonymous,
        )
    except ConfigurationError as e:
        print(f"saga-processor: the console cannot start: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.enable_actions and not (token or auth.authenticates):
        print(
            "saga-processor: --enable-actions needs a way to sign in: SAGA_CONSOLE__OPERATORS, "
            "SAGA_CONSOLE__TRUSTED_PROXIES or SAGA_CONSOLE__TOKEN",
            file=sys.stderr,
        )
        return EXIT_USAGE
    host = args.host or cs.host
    port = args.port if args.port is not None else cs.port
    warning = exposure(host, cs.anonymous)
    if warning is not None:
        log.warning("%s", warning)
    backend = Backend(settings, app=app_of(args))
    app = create_app(
        backend,
        actions=args.enable_actions,
        token=token,
        auth=auth,
        show_payloads=cs.show_payloads,
        token_name=backend.by,
    )
    print(f"saga console on http://{host}:{port}/", flush=True)
    budget = settings.shutdown_timeout.total_seconds()
    server = uvicorn.Server(server_config(app, host, port, timeout_graceful_shutdown=int(budget)))
    # uvicorn's own handler starts its graceful stop; the bound ends the process even if the
    # producer's flush or a request holds on past it (see processor._runtime.stopping).
    bound = ShutdownBound(budget)
    graceful = server.handle_exit

    def handle_exit(sig: int, frame: FrameType | None) -> None:
        bound.arm()
        graceful(sig, frame)

    server.handle_exit = handle_exit  # type: ignore[method-assign]
    server.run()
    return EXIT_OK


def exposure(host: str, anonymous: str | None) -> str | None:
    """The warning for a console anyone can read from beyond this machine; None if there is none."""
    if _loopback(host) or anonymous is None:
        return None
    return (
        f"the console listens on {host} and anyone who reaches it reads as a {anonymous}: put it "
        "behind an authenticating proxy (SAGA_CONSOLE__TRUSTED_PROXIES) or set "
        "SAGA_CONSOLE__ANONYMOUS=null and sign operators in (SAGA_CONSOLE__OPERATORS)"
    )


def _loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
