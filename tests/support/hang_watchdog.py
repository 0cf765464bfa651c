"""A hang fails the run with every thread's stack, even when no Python thread can run.

pytest-timeout (``timeout`` in pyproject.toml) fails one test with a stack when it overruns, but
it acts from Python: a signal handler on the main thread. A thread stuck in a native call that
keeps the interpreter lock (confluent-kafka does so in some librdkafka calls, which can wait for
ever on a broker that went away) stops every Python thread, that handler included, and the run
would hang until CI's own limit.

So each test also arms faulthandler's watchdog, a native thread that needs no interpreter lock:
at the test's timeout plus :data:`GRACE` it writes every thread's stack to the terminal and ends
the process (exit code 1). The test it was in is written to ``SAGA_TEST_CURRENT_FILE`` (when set;
a pytest-xdist worker adds its name as a suffix) for as long as it runs, so whoever started pytest
(``tests/run.py``) can say which test hung, and ends what the run left behind.
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Generator
from pathlib import Path

import pytest

# Seconds past a test's own timeout before the native watchdog ends the run; the environment
# variable exists for the test of this module.
GRACE = float(os.environ.get("SAGA_TEST_HANG_GRACE", "60"))
# The last test of a session also stops the shared services in its teardown.
SESSION_TEARDOWN = 300.0
CURRENT_FILE = "SAGA_TEST_CURRENT_FILE"

_terminal = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    # A copy of stderr as it is now (the terminal): during a test, pytest captures fd 2.
    config.stash[_terminal] = os.dup(2)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _terminal in config.stash:
        os.close(config.stash[_terminal])


def _timeout(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    return float(item.config.getini("timeout") or 0)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    timeout = _timeout(item)
    current = current_file()
    if current:
        Path(current).write_text(f"{item.nodeid}\n{timeout + GRACE:.0f}\n")
    _arm(item, timeout + GRACE if timeout > 0 else 0.0)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()
        if current:
            Path(current).write_text("")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    if nextitem is None and (timeout := _timeout(item)) > 0:
        # The last test's teardown also ends the session's fixtures: time of its own.
        _arm(item, timeout + GRACE + SESSION_TEARDOWN)
    return (yield)


def current_file() -> str | None:
    """Where this process writes the test it runs: one file per pytest-xdist worker."""
    current = os.environ.get(CURRENT_FILE)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return f"{current}.{worker}" if current and worker else current


def _arm(item: pytest.Item, limit: float) -> None:
    if limit > 0:
        faulthandler.dump_traceback_later(limit, exit=True, file=item.config.stash[_terminal])
