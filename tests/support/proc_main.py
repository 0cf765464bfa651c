"""A processor process as users run it, plus optional fault injection for crash tests.

SAGA_FAULT_POINT=before-write|before-commit|after-commit|after-produce
    (before-write: the batch is loaded and planned in its transaction, nothing written yet)
SAGA_FAULT_AT=N          act on the Nth time the point is reached (default 1)
SAGA_FAULT_ACTION=kill|stop   SIGKILL or SIGSTOP this process there (default kill)
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from processor.cli import main as cli_main
from processor.runtime.hooks import Hooks
from processor.runtime.processor import Processor
from processor.settings import load_settings


def _act(point: str, at: int, action: str) -> Callable[[], None]:
    hits = 0

    def act() -> None:
        nonlocal hits
        hits += 1
        if hits == at:
            print(f"fault: {action} at {point} #{at}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGSTOP)

    return act


def main() -> int:
    point = os.environ.get("SAGA_FAULT_POINT")
    if not point:
        return cli_main(["run"])
    import logging

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    act = _act(
        point,
        int(os.environ.get("SAGA_FAULT_AT", "1")),
        os.environ.get("SAGA_FAULT_ACTION", "kill"),
    )
    hooks = Hooks()
    hooks.on(point, act)
    proc = Processor(load_settings(), hooks=hooks)
    proc.start()
    assert proc.worker is not None
    if point == "before-write":
        # The worker calls no hook between planning and writing; the planner runs right there.
        plan = proc.worker.planner.plan

        def plan_then_hook(*args: Any, **kwargs: Any) -> Any:
            planned = plan(*args, **kwargs)
            hooks.fire("before-write")
            return planned

        proc.worker.planner.plan = plan_then_hook  # type: ignore[method-assign]
    signal.signal(signal.SIGTERM, lambda *_: proc.stop())
    proc.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
