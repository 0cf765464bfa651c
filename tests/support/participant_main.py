"""The demo's participant app as `participant run` runs it, with a fault named by SAGA_FAULT_*.

The same variables as ``tests.support.proc_main``; the service fires ``revoke`` only.
"""

from __future__ import annotations

import sys

from demo.participants import app
from processor._bootstrap.participant import run_participant
from processor._observe.logs import configure_logging
from processor.settings import load_settings
from tests.support.proc_main import hooks_from_env

if __name__ == "__main__":
    configure_logging("INFO", "text")
    participants = app()
    settings = load_settings(defaults=participants.settings)
    sys.exit(run_participant(settings, participants, hooks=hooks_from_env()))
