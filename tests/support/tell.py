"""What a failed test's processes said, at the end of its report.

A CI log keeps only the end of a run, where pytest's summary is: a test that failed while
processes ran (a drain that timed out, a replica that never rejoined) says little on its own.
Fixtures that start processes call :func:`tell_if_failed` after stopping them. A test that
passed but coped with something rare says so through :func:`notice`, at the end of the run.
"""

from __future__ import annotations

import re
import sys
import threading
import time
import traceback
from collections.abc import Iterable
from typing import Any

import pytest

from processor._runtime.participant.service import ParticipantRuntime
from tests.support.procs import ProcessorProcess

_FAILED = pytest.StashKey[bool]()
LINES = 25
# The INFO lines told with the warnings: rebalances, and claims that wait on another session.
_TOLD = re.compile(r"revoked|assigned|still busy")
"""How many of each process's lines a failed test shows."""


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


def notice(request: pytest.FixtureRequest, text: str) -> None:
    """Records something a passing test saw and coped with, for the run's closing summary.

    For rare events a test rides out but the team should hear of (a client that had to be
    replaced after a broker restart): a CI log that passed still says how often they happen.
    """
    request.node.user_properties.append(("noticed", text))


def replaced_clients(runtime: ParticipantRuntime) -> int:
    """How many times the service's consumer had its Kafka client replaced (see SagaConsumer)."""
    rebalances = getattr(runtime.consumer, "rebalances", None)
    return int(rebalances["replaced"]) if rebalances is not None else 0


def pytest_terminal_summary(terminalreporter: Any) -> None:
    noticed = [
        (report.nodeid, value)
        for reports in terminalreporter.stats.values()
        for report in reports
        for key, value in getattr(report, "user_properties", ())
        if key == "noticed" and getattr(report, "when", "call") == "call"
    ]
    if noticed:
        terminalreporter.section("noticed")
        for nodeid, text in noticed:
            terminalreporter.write_line(f"{nodeid}: {text}")


def failed(request: pytest.FixtureRequest) -> bool:
    """Whether the test that requested the fixture failed (known once its call has run)."""
    return bool(request.node.stash.get(_FAILED, False))


def tell_if_failed(request: pytest.FixtureRequest, procs: Iterable[ProcessorProcess]) -> None:
    """Writes the processes' warnings and rebalances (cut short) if the test failed."""
    if failed(request):
        tell(procs)


def tell(procs: Iterable[ProcessorProcess]) -> None:
    for proc in procs:
        lines = [
            # A claim that waits names who holds its rows at the end of the line: kept whole.
            line if "still busy" in line else line[:220]
            for line in proc.log().splitlines()
            if not re.search(r" (DEBUG|INFO) ", line) or _TOLD.search(line)
        ]
        sys.stdout.write(f"--- {proc.log_path}: last {min(LINES, len(lines))} lines ---\n")
        sys.stdout.write("".join(f"{line}\n" for line in lines[-LINES:]))


def thread_stacks(prefix: str, depth: int = 12) -> str:
    """Where this process's threads whose names start with ``prefix`` are now.

    For a loop running in the test's own process that stopped making progress: a thread stuck
    in a call shows that call, one that goes round shows its wait.
    """
    frames = sys._current_frames()
    out: list[str] = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        if thread.name.startswith(prefix) and frame is not None:
            stack = "".join(traceback.format_stack(frame)[-depth:])
            out.append(f"thread {thread.name}:\n{stack}")
    return "\n".join(out) or f"no thread named {prefix}*"


def participant_state(runtime: ParticipantRuntime) -> str:
    """A participant running in the test's process: its loops, its group member, its stacks."""
    lines: list[str] = []
    supervisor = runtime.supervisor
    lines.append(f"loops alive {supervisor.alive() if supervisor else 'not started'}")
    if runtime.last_step is not None:
        lines.append(f"consumer loop last stepped {time.monotonic() - runtime.last_step:.1f} s ago")
    lines.append(
        f"batches failing in a row {runtime.failing}, failed rounds {runtime.failed_rounds}"
    )
    consumer = runtime.consumer
    assigned = getattr(consumer, "assigned", None)
    rebalances = getattr(consumer, "rebalances", None)
    lines.append(
        f"assigned {sorted(assigned) if assigned is not None else '?'}; rebalances {rebalances}"
    )
    lines.append(thread_stacks("participant-"))
    return "\n".join(lines)
