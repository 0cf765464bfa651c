"""A loop that dies takes the process down, loudly, so that the platform restarts it."""

from __future__ import annotations

import time

import pytest

from processor._cli.commands import EXIT_LOOP_DIED
from tests.e2e.conftest import E2EEnv, log_lines
from tests.support.harness import wait_until

pytestmark = [pytest.mark.e2e]


@pytest.mark.parametrize(
    ("point", "loop"), [("relay-round", "relay"), ("poller-step", "deadline-poller")]
)
def test_a_loop_that_raises_ends_the_process_non_zero_within_seconds(
    e2e_env: E2EEnv, point: str, loop: str
) -> None:
    fault = {"SAGA_FAULT_POINT": point, "SAGA_FAULT_AT": "2", "SAGA_FAULT_ACTION": "raise"}
    proc = e2e_env.start("doomed", fault, relay={"poll_interval": "200ms"})
    # Startup (imports, migration, joining the group) is not what is measured: the clock starts
    # when the fault is injected.
    wait_until(
        lambda: log_lines(proc, rf"fault: raise at {point} #2") or not proc.alive(),
        timeout=90,
        what=f"the fault at {point}",
    )
    injected = time.monotonic()
    wait_until(lambda: not proc.alive(), timeout=15, what="the process to exit")
    assert time.monotonic() - injected < 10
    assert proc.popen.returncode == EXIT_LOOP_DIED, proc.log()
    output = proc.log()
    assert log_lines(proc, rf"ERROR .*loop '{loop}' died on RuntimeError"), output
    assert "RuntimeError: fault injected at" in output  # the traceback is in the log
    assert log_lines(proc, rf"saga-processor: loop '{loop}' died: RuntimeError"), output
    assert log_lines(proc, r"processor doomed stopped"), output
