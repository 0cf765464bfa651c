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
from typing import Any

from processor.cli import main as cli_main
from processor.runtime.processor import Processor
from processor.settings import load_settings


def _hook(point: str, at: int, action: str) -> object:
    hits = {"n": 0}

    def hook(reached: str) -> None:
        if reached != point:
            return
        hits["n"] += 1
        if hits["n"] == at:
            print(f"fault: {action} at {point} #{at}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGSTOP)

    return hook


def main() -> int:
    point = os.environ.get("SAGA_FAULT_POINT")
    if not point:
        return cli_main(["run"])
    import logging

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    proc = Processor(load_settings())
    proc.start()
    hook = _hook(
        point,
        int(os.environ.get("SAGA_FAULT_AT", "1")),
        os.environ.get("SAGA_FAULT_ACTION", "kill"),
    )
    assert proc.worker is not None
    proc.worker.fault_hook = hook  # type: ignore[assignment]
    if proc.relay is not None:
        proc.relay.fault_hook = hook  # type: ignore[assignment]
    if point == "before-write":
        # The worker calls no hook between planning and writing; the planner runs right there.
        plan = proc.worker.planner.plan

        def plan_then_hook(*args: Any, **kwargs: Any) -> Any:
            planned = plan(*args, **kwargs)
            hook("before-write")  # type: ignore[operator]
            return planned

        proc.worker.planner.plan = plan_then_hook  # type: ignore[method-assign]
    signal.signal(signal.SIGTERM, lambda *_: proc.stop())
    proc.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
