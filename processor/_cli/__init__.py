"""The ``saga-processor`` command line: one module a group of commands.

``main`` (the entry point) parses and dispatches; ``commands`` holds what every command shares
(loading the application, output, exit codes) and the run command; ``inspect``, ``operate``,
``stored`` (deadlines, machine states, parked sagas, the failed outbox), ``preflight``,
``topics`` and ``participant`` hold their groups. Every adapter a command uses comes from
:mod:`processor._bootstrap`.
"""

from processor._cli.main import (
    COMMANDS,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    NO_JSON,
    build_parser,
    main,
)

__all__ = [
    "COMMANDS",
    "EXIT_REFUSED",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "NO_JSON",
    "build_parser",
    "main",
]
