"""Command line: `saga-processor [run] [MODULE:ATTR]`, and operator commands.

`MODULE:ATTR` names the application object (`processor.SagaApp`): its sagas, dependencies and
settings. Every command that needs configuration takes it as `--app MODULE:ATTR` or from
`SAGA_APP`; `SAGA_*` variables override the app's settings.

Every command but `run`, `console` and `participant run` (which serve until stopped: their log
is their output) takes `--json` and then prints one JSON document on stdout (on an error too:
`{"ok": false, "error": ..., "exit_code": N}`). Exit codes: 0 done; 1 found what was asked
about, or refused (a schema not migrated too); 2 a usage or configuration mistake; 3 the
database or the broker did not answer (or no processor applied a request within `--wait`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from processor._cli import commands as c
from processor._cli import inspect as i
from processor._cli import operate as o
from processor._cli import participant as pa
from processor._cli import preflight as p
from processor._cli import schemas as sc
from processor._cli import stored as st
from processor._cli import topics as t
from processor._errors import Refused, SagaError
from processor._observe.logs import configure_logging
from processor._observe.metrics import package_version
from processor.settings import ProcessorSettings, load_settings


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand.

    Attributes:
        name: What follows `saga-processor` on the command line.
        help: One line for `--help`.
        arguments: Adds the subcommand's own arguments to its parser.
        run: Does the work; returns the exit code.
    """

    name: str
    help: str
    arguments: c.Arguments
    # A command that reads only its arguments runs without SAGA_* configuration.
    run: c.Run | c.Offline
    offline: bool = False
    # A command that never opens the database runs without SAGA_DATABASE__URL.
    database: bool = True


# Every subcommand, in the order `--help` lists them.
COMMANDS: tuple[Command, ...] = (
    Command(
        "run",
        "consume, run sagas, relay the outbox and fire deadlines (the default)",
        c.app_arguments,
        c.run,
    ),
    Command(
        "participant",
        "`participant run|migrate MODULE:ATTR`: a service answering the sagas' commands",
        pa.participant_arguments,
        pa.participant,
    ),
    Command(
        "migrate",
        "create or upgrade the database schema, then exit (`--sql`: print the pending DDL)",
        p.migrate_arguments,
        p.migrate,
    ),
    Command(
        "citus-node",
        "the Citus node the schema's processes connect through (`move`: make it this URL's)",
        p.citus_node_arguments,
        p.citus_node,
    ),
    Command(
        "check",
        "preflight before a deploy: stored sagas load, handlers exist, topics and schema match",
        p.check_arguments,
        p.check,
    ),
    Command(
        "topics",
        "`topics plan|create|check`: the topics the sagas read and write, made and checked",
        t.topics_arguments,
        t.topics,
        database=False,
    ),
    Command(
        "show",
        "one saga in full: status, state, deadlines, held and failed rows, operator actions, "
        "timeline",
        i.show_arguments,
        i.show,
    ),
    Command(
        "sagas",
        "`sagas list` with filters, `sagas stuck` (longest in their state first)",
        i.sagas_arguments,
        i.sagas,
    ),
    Command(
        "saga",
        "`saga cancel|terminate|retry|resolve SAGA_TYPE SAGA_ID ... --reason WHY` (or "
        "`--where KEY=VALUE` for every matching saga), in log order",
        o.saga_arguments,
        o.saga,
    ),
    Command(
        "deadlines",
        "list one saga's deadlines; `deadlines fire-now|cancel SAGA_TYPE SAGA_ID NAME`",
        o.deadline_arguments,
        o.deadlines,
    ),
    Command(
        "overdue",
        "list deadlines that are due but have not fired yet",
        c.limit_arguments("rows"),
        st.overdue,
    ),
    Command(
        "diagram",
        "print a state machine saga as a Mermaid stateDiagram-v2",
        c.target_arguments,
        c.diagram,
        offline=True,
    ),
    Command(
        "lint-saga",
        "report unreachable states, untimed WAITING states, lingering deadlines; in a saga "
        "function, calls a replay would not repeat (the clock, randomness, I/O)",
        c.lint_arguments,
        c.lint_saga,
        offline=True,
    ),
    Command(
        "states",
        "count state machine sagas per machine state, with the oldest age",
        c.states_arguments,
        st.states,
    ),
    Command(
        "retry",
        "replay a parked saga's held messages after its cause was fixed",
        c.retry_arguments,
        st.retry,
    ),
    Command(
        "parked",
        "list parked sagas; `parked retry|skip SAGA_TYPE SAGA_ID --reason WHY`",
        o.parked_arguments,
        o.parked,
    ),
    Command(
        "dead-letters",
        "`dead-letters list|show|replay|purge`",
        i.dead_letter_arguments,
        i.dead_letters,
    ),
    Command(
        "audit",
        "`audit list`: operator actions (replays, purges, discards, skips, terminations, ...)",
        i.audit_arguments,
        i.audit,
    ),
    Command(
        "console",
        "serve the web console (read-only unless --enable-actions and a token)",
        o.console_arguments,
        o.console,
    ),
    Command(
        "outbox",
        "outbox rows the relay set aside: `outbox failed list|retry|discard`",
        st.outbox_arguments,
        st.outbox,
    ),
    Command(
        "schemas",
        "`schemas MODULE...`: the AsyncAPI 3 document of the messages and sagas in them; "
        "`schemas register|check`: the models' schemas in the Schema Registry, registered or "
        "checked for compatibility before a deploy",
        sc.schemas_arguments,
        sc.schemas,
        offline=True,
    ),
)
DEFAULT_COMMAND = "run"


LONG_RUNNING = frozenset({"run", "console", "migrate", "participant"})
"""Commands whose progress is their log; the others answer on stdout and log only trouble."""

NO_JSON = frozenset({"run", "console"})
"""Commands that serve until stopped: their output is their log, so `--json` does not apply
(nor to `participant run`). Every other command takes `--json`: one JSON document on stdout."""


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser: the global options and every subcommand's arguments."""
    parser = argparse.ArgumentParser(prog="saga-processor", description=__doc__)
    parser.add_argument(
        "--log-level",
        default=None,
        help="INFO for the long-running commands (run, console), WARNING for the others, whose "
        "output is their answer",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command")
    for command in COMMANDS:
        command_parser = sub.add_parser(command.name, help=command.help)
        command.arguments(command_parser)
        if not command.offline:
            command_parser.add_argument(
                "--app",
                metavar="MODULE:ATTR",
                default=None,
                help="the application object (default: SAGA_APP)",
            )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parses the command line, runs the subcommand and returns its exit code.

    The operator commands' exit codes: 0 done; 1 found what was asked about, or refused (a
    `processor._errors.Refused`: no such saga, not parked, nothing matched); 2 a usage or
    configuration mistake (any other `SagaError`, as argparse's own usage errors); 3 a database
    or broker out of reach (`EXIT_UNAVAILABLE`). A schema that lacks a table, column or itself
    (never migrated, or older than this release) is refused: exit 1, naming `saga-processor
    migrate`. Each error is one line on stderr, without a traceback, and with `--json` one JSON
    document on stdout as well (see :func:`failed`). `run` exits with 70 when a loop of the
    processor died (see `processor._cli.commands.EXIT_LOOP_DIED`).
    """
    commands = {command.name: command for command in COMMANDS}
    args = build_parser().parse_args(argv)
    # Read before the settings, so that their own errors are logged in the chosen format; the
    # settings check the value again (a typo there is refused like any other).
    log_format = os.environ.get("SAGA_LOG_FORMAT", "text").strip().lower()
    if log_format not in ("text", "json"):
        return failed(args, "SAGA_LOG_FORMAT: use text or json", EXIT_USAGE)
    level = args.log_level or (
        "INFO" if (args.command or DEFAULT_COMMAND) in LONG_RUNNING else "WARNING"
    )
    configure_logging(level, "json" if log_format == "json" else "text")
    settings: ProcessorSettings | None = None
    try:
        command = commands[args.command or DEFAULT_COMMAND]
        if command.offline:
            return cast(c.Offline, command.run)(args)
        from processor._authoring.application import app_target, load_app, load_participant_app

        # The app is loaded before the settings: its settings lie under the environment's.
        target = app_target(getattr(args, "target", None) or getattr(args, "app", None))
        load = load_participant_app if command.name == "participant" else load_app
        app = load(target) if target else None
        args.saga_app = app
        defaults = dict(app.settings) if app is not None else {}
        if not command.database and DATABASE_URL not in os.environ:
            # Required by the settings for every command that connects; this one never does, so
            # an address nothing will ever dial stands in for it.
            defaults.setdefault("database", {"url": UNUSED_DATABASE})
        settings = load_settings(defaults=defaults or None)
        return cast(c.Run, command.run)(args, settings)
    except Exception as e:
        why = _unavailable(e)
        if why is not None:
            return failed(args, why, EXIT_UNAVAILABLE)
        missing = _not_migrated(e, settings)
        if missing is not None:
            return failed(args, missing, EXIT_REFUSED)
        if not isinstance(e, SagaError):
            raise
        return failed(args, str(e), EXIT_REFUSED if isinstance(e, Refused) else EXIT_USAGE)


def failed(args: argparse.Namespace, message: str, code: int) -> int:
    """Reports a command's error and returns ``code``.

    One line on stderr and, with `--json`, one JSON document on stdout:
    ``{"ok": false, "error": MESSAGE, "exit_code": CODE}``.
    """
    print(f"saga-processor: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        json.dump({"ok": False, "error": message, "exit_code": code}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return code


DATABASE_URL = "SAGA_DATABASE__URL"
UNUSED_DATABASE = "postgresql://unused.invalid/unused"
"""Stands in for the database URL of a command that never connects (``.invalid`` resolves to
nothing, RFC 2606)."""

EXIT_REFUSED = 1
"""The command ran and the answer is no (as `cli.inspect.EXIT_PROBLEM`): nothing changed. A
schema that is not migrated is one (as `check` reports a schema behind this code)."""
EXIT_USAGE = 2
"""Bad arguments or configuration (argparse's own usage errors exit 2 as well)."""
EXIT_UNAVAILABLE = 3
"""A service the command needs did not answer: nothing was done (`cli.inspect.EXIT_NOT_SENT`)."""


def _unavailable(e: BaseException) -> str | None:
    """One line saying the database or the broker is out of reach, when that is what ``e`` means."""
    from processor._bootstrap.errors import unreachable
    from processor.ops._inspect import NotSent

    if isinstance(e, NotSent | c.Unavailable):
        return str(e)
    return unreachable(e)


def _not_migrated(e: BaseException, settings: ProcessorSettings | None) -> str | None:
    """One line naming `saga-processor migrate`, when ``e`` means the schema is not migrated."""
    from processor._bootstrap.errors import not_migrated

    return not_migrated(e, settings)
