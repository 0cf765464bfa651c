"""What a failed test's processes said, at the end of its report.

A CI log keeps only the end of a run, where pytest's summary is: a test that failed while
processes ran (a drain that timed out, a replica that never rejoined) says little on its own.
Fixtures that start processes call :func:`tell_if_failed` after stopping them.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import Any

import pytest

from tests.support.procs import ProcessorProcess

_FAILED = pytest.StashKey[bool]()
LINES = 25
"""How many of each process's lines a failed test shows."""


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


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
            line[:220]
            for line in proc.log().splitlines()
            if not re.search(r" (DEBUG|INFO) ", line) or "revoked" in line or "assigned" in line
        ]
        sys.stdout.write(f"--- {proc.log_path}: last {min(LINES, len(lines))} lines ---\n")
        sys.stdout.write("".join(f"{line}\n" for line in lines[-LINES:]))
