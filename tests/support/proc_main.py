"""A processor process as users run it, plus optional fault injection for crash tests.

The sagas come from the app SAGA_APP names (else SAGA_SAGAS), as for `saga-processor run`.

SAGA_FAULT_POINT=before-write|before-commit|after-commit|after-produce
    (before-write: the batch is loaded and planned in its transaction, nothing written yet)
SAGA_FAULT_AT=N          act on the Nth time the point is reached (default 1)
SAGA_FAULT_ACTION=kill|stop|raise|hold-gil   SIGKILL or SIGSTOP this process there (default
    kill), raise a RuntimeError in the loop that reached the point (e.g. relay-round,
    poller-step), or block that thread for ever holding the GIL (tests.support.stuck)
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

from processor._authoring.application import app_target, load_app
from processor._cli import main as cli_main
from processor._cli.commands import run_processor
from processor._runtime.hooks import Hooks
from processor.settings import load_settings
from tests.support.stuck import hold_the_interpreter


def _fault(point: str, at: int, action: str) -> Callable[[], None]:
    hits = 0

    def hit() -> None:
        nonlocal hits
        hits += 1
        if hits == at:
            print(f"fault: {action} at {point} #{at}", file=sys.stderr, flush=True)
            if action == "raise":
                raise RuntimeError(f"fault injected at {point} #{at}")
            if action == "hold-gil":
                hold_the_interpreter()
            if action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
                return
            # To this thread, not the process: a process-directed SIGSTOP may be taken by
            # another thread, and this one runs on until that thread's group stop reaches it,
            # long enough to send the COMMIT it was meant to stop before. Taken by this thread,
            # it stops here, before returning to the caller.
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)

    return hit


def hooks_from_env() -> Hooks:
    """The fault the SAGA_FAULT_* variables name, if any."""
    hooks = Hooks()
    point = os.environ.get("SAGA_FAULT_POINT")
    if point:
        hooks.on(
            point,
            _fault(
                point,
                int(os.environ.get("SAGA_FAULT_AT", "1")),
                os.environ.get("SAGA_FAULT_ACTION", "kill"),
            ),
        )
    return hooks


def main() -> int:
    point = os.environ.get("SAGA_FAULT_POINT")
    if not point:
        return cli_main(["run"])
    import logging

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    hooks = hooks_from_env()
    target = app_target()
    app = load_app(target) if target else None
    settings = load_settings(defaults=app.settings if app is not None else None)
    return run_processor(settings, app, hooks)


if __name__ == "__main__":
    sys.exit(main())
