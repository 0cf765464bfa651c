"""Command line: `saga-processor [run]`, and operator commands. Configured by SAGA_* variables."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import TYPE_CHECKING

from processor.errors import SagaError
from processor.settings import ProcessorSettings, load_settings

if TYPE_CHECKING:  # the CLI imports the database driver only for commands that use it
    from processor.postgres.schema import Tables
    from processor.postgres.store import Conn

log = logging.getLogger("processor")

Arguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace, ProcessorSettings], int]
# Each operator command module registers itself here: name -> (help, add arguments, run).
COMMANDS: dict[str, tuple[str, Arguments, Run]] = {}


def command(name: str, help: str, *, arguments: Arguments | None = None) -> Callable[[Run], Run]:
    """Registers `fn(args, settings) -> exit code` as `saga-processor NAME`.

    Args:
        name: The subcommand.
        help: One line for `--help`.
        arguments: Adds the subcommand's own arguments to its parser.
    """

    def register(fn: Run) -> Run:
        COMMANDS[name] = (help, arguments or (lambda parser: None), fn)
        return fn

    return register


def saga_key_arguments(parser: argparse.ArgumentParser) -> None:
    """The SAGA_TYPE SAGA_ID pair that names one saga instance."""
    parser.add_argument("saga_type", metavar="SAGA_TYPE")
    parser.add_argument("saga_id", metavar="SAGA_ID")


def text_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Fixed-width columns, two spaces apart, header first; no trailing blanks."""
    cells = [tuple(header), *(tuple(r) for r in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def ops_connection(settings: ProcessorSettings) -> tuple[Conn, Tables]:
    """An autocommit connection for operator commands, with the processor's tables."""
    from processor.postgres.connect import connect
    from processor.runtime.processor import tables_for

    url = settings.database.url.get_secret_value()
    conn = connect(url, application_name="saga-processor-ops", autocommit=True)
    return conn, tables_for(settings)


@command("run", "consume, run sagas, relay the outbox and fire deadlines (the default)")
def run(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Runs the processor until SIGTERM or SIGINT; a second signal exits at once."""
    from processor.runtime.processor import Processor

    proc = Processor(settings)
    proc.start()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: finishing the batch in hand, then stopping", signum)
        proc.stop()
        # A second signal, or a shutdown that overruns its budget, ends the process at once;
        # nothing is lost: uncommitted work is redone by whoever owns the partitions next.
        timer = threading.Timer(settings.shutdown_timeout.total_seconds(), _force_exit)
        timer.daemon = True
        timer.start()
        signal.signal(signal.SIGTERM, lambda *_: _force_exit())
        signal.signal(signal.SIGINT, lambda *_: _force_exit())

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    proc.run()
    return 0


def _force_exit() -> None:
    log.warning("shutdown overran its budget; exiting now")
    logging.shutdown()
    import os

    os._exit(3)


@command("migrate", "create or upgrade the database schema, then exit")
def migrate(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Brings the database schema to the current version and prints it."""
    from processor.postgres.connect import ensure_schema
    from processor.runtime.processor import tables_for

    version = ensure_schema(settings.database.url.get_secret_value(), tables_for(settings))
    print(f"schema {settings.database.schema_name} at version {version}")
    return 0


def _load_command_modules() -> None:
    # Operator commands live beside the code they drive; importing them registers them.
    import importlib
    import pkgutil

    import processor.ops

    for module in pkgutil.iter_modules(processor.ops.__path__):
        importlib.import_module(f"processor.ops.{module.name}")


def main(argv: Sequence[str] | None = None) -> int:
    """The `saga-processor` command: parses arguments, configures logging, runs one command.

    Returns:
        The process exit code.
    """
    _load_command_modules()
    parser = argparse.ArgumentParser(prog="saga-processor", description=__doc__)
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command")
    for name, (help_text, add_arguments, _fn) in COMMANDS.items():
        add_arguments(sub.add_parser(name, help=help_text))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(threadName)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        settings = load_settings()
        _help, _add, fn = COMMANDS[args.command or "run"]
        return fn(args, settings)
    except SagaError as e:
        print(f"saga-processor: {e}", file=sys.stderr)
        return 2
