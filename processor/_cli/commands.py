"""What every `saga-processor` subcommand shares, and the `run`, `diagram` and `lint-saga` commands.

Handlers get their adapters from the settings through :mod:`processor._bootstrap`, call the
operator services of `processor.ops` or the runtime, and print the result. The composition root
(and with it the database driver) and the runtime are imported only by the handlers that use
them, so `diagram` and `lint-saga` work without either. `processor._cli.main` lists the commands.
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

from processor._authoring.definition import definition_of
from processor._authoring.orchestration import MachineSpec, mermaid
from processor._errors import SagaDefinitionError, SagaError
from processor._ports.views import jsonable
from processor.ops._diagram import load_spec
from processor.ops._lint import lint_saga as lint_saga_class
from processor.ops._lint import sagas_to_lint
from processor.settings import ProcessorSettings

if TYPE_CHECKING:
    from processor._authoring.application import SagaApp
    from processor._bootstrap.adapters import Adapters, InspectQueries, OperatorQueries
    from processor._ports import RecordProducer
    from processor._runtime.hooks import Hooks
    from processor._runtime.processor import Processor

log = logging.getLogger("processor")

Arguments = Callable[[argparse.ArgumentParser], None]
"""Adds a subcommand's own arguments to its parser."""
Run = Callable[[argparse.Namespace, ProcessorSettings], int]
"""Runs a subcommand; returns the process exit code."""
Offline = Callable[[argparse.Namespace], int]
"""Runs a subcommand that needs no configuration (no database, no broker)."""


class Unavailable(SagaError):
    """A service did not answer in time, or no processor applied a request within `--wait`.

    `cli.main` reports it like an unreachable database or broker: exit code 3.
    """


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


def lint_arguments(parser: argparse.ArgumentParser) -> None:
    """What `lint-saga` checks: a saga class, a module of sagas, or an app (+ `--saga`)."""
    parser.add_argument(
        "target",
        metavar="MODULE:SAGA|MODULE|MODULE:ATTR",
        nargs="?",
        default=None,
        help="a state machine saga or saga function, a module holding sagas, or the "
        "application object (default: SAGA_APP); a module or an app is checked whole",
    )
    parser.add_argument("--saga", default=None, help="only this saga (its type or class name)")
    json_flag(parser)


def spec_of(args: argparse.Namespace) -> MachineSpec:
    """The state machine the `diagram` target (or SAGA_APP) names."""
    from processor._authoring.application import app_target

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


def adapters(settings: ProcessorSettings) -> Adapters:
    """The adapters a command reaches the database and the broker through."""
    from processor._bootstrap.adapters import Adapters

    return Adapters(settings)


def operator_queries(settings: ProcessorSettings) -> OperatorQueries:
    """Operator queries on an autocommit connection of their own, over the processor's tables."""
    return adapters(settings).operator_queries()


@contextmanager
def inspect_queries(settings: ProcessorSettings) -> Iterator[InspectQueries]:
    """Inspect queries on an autocommit connection of their own, closed on leaving."""
    with adapters(settings).inspect_queries() as queries:
        yield queries


@contextmanager
def producer(settings: ProcessorSettings) -> Iterator[RecordProducer]:
    """A producer for operator records and dead-letter replays, closed on leaving."""
    made = adapters(settings).record_producer()
    try:
        yield made
    finally:
        made.close(10.0)


# -- the processor -----------------------------------------------------------------------------


EXIT_LOOP_DIED = 70
"""Exit code of `run` when a loop of the processor died (EX_SOFTWARE): restart the process."""


def run(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Runs the processor until SIGTERM or SIGINT.

    Exit code 0 after a clean stop; :data:`EXIT_LOOP_DIED` (70) when the consumer, the relay,
    its listener or the deadline poller died on an error (logged with its traceback), so that
    the platform restarts the process; 3 when a shutdown overran ``SAGA_SHUTDOWN_TIMEOUT`` (or a
    second signal came); 1, after a dump of every thread's stack, when no Python thread could
    run 5 s past it (see :mod:`processor._runtime.stopping`).
    """
    return run_processor(settings, app_of(args))


def run_processor(
    settings: ProcessorSettings, app: SagaApp | None, hooks: Hooks | None = None
) -> int:
    """Builds the app's dependencies and runs the processor until it stops; see :func:`run`."""
    from processor._bootstrap.participant import hosted
    from processor._bootstrap.processor import build_processor
    from processor._runtime.assembly import open_sagas
    from processor._runtime.stopping import exit_now

    # The app's dependencies are built once for the process and closed after the processor
    # stopped (on SIGTERM too: serve() returns once the processor has shut down).
    with open_sagas(settings, app) as (saga_classes, dependencies):
        proc = build_processor(settings, saga_classes, dependencies=dependencies, hooks=hooks)
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
    :class:`processor._runtime.stopping.ShutdownBound`.
    """
    from processor._errors import LoopDied
    from processor._runtime.stopping import ShutdownBound, on_stop_signals

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
    """Prints the problems of the sagas the target names; exit code 1 when there are any.

    A state machine saga's machine is checked, and a saga function's source, for calls a
    replay would not repeat (the wall clock, randomness, I/O, threads). A saga that fails its
    own checks when imported (an unknown policy or reply kind, a decorator used bare, a
    handler of the wrong kind) is what a lint is for: its problems are reported as findings,
    one per line, rather than as a usage error.
    """
    from processor._authoring.application import app_target

    target = app_target(args.target)
    if target is None:
        raise SagaError(
            "name the saga as MODULE:SAGA, a module as MODULE, or the app as MODULE:ATTR "
            "(or SAGA_APP)"
        )
    checked: list[str] = []
    try:
        classes = sagas_to_lint(target, args.saga)
        problems = [p for cls in classes for p in lint_saga_class(cls)]
        checked = [definition_of(cls).saga_type for cls in classes]
    except SagaDefinitionError as e:
        problems = [f"{e.subject}: {p}" if e.subject else p for p in e.problems]
    # A module or an app is checked whole: naming what was read shows nothing was skipped.
    text = "\n".join(problems) or f"{target}: no problems found in {', '.join(checked)}"
    emit(args, {"ok": not problems, "problems": problems, "checked": checked}, text)
    return 1 if problems else 0
