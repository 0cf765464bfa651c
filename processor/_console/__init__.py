"""The web console: `saga-processor console` serves sagas, their timelines and dead letters.

Read-only unless started with `--enable-actions`; every action then also needs the console
token (`SAGA_CONSOLE__TOKEN`), and goes through the same operator services as the CLI.
"""

from processor._console.app import create_app
from processor._console.backend import Backend

__all__ = ["Backend", "create_app"]
