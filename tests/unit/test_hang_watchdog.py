"""A hang fails the run with a thread dump and a clear line, even with the interpreter held.

A pytest run of four tests, through ``tests/run.py`` as `make test` runs it, with a 1-second
timeout and a 2-second grace: a test that waits for ever fails alone (pytest-timeout), the next
passes, and a test whose thread keeps the interpreter lock in a native call for ever (so that
no Python code runs again, pytest-timeout's handler included) ends the run with every thread's
stack, a line naming the test, and a process it had started ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.procs import REPO, alive

HANGS = """
import subprocess
import threading

from tests.support.stuck import hold_the_interpreter


def test_waits_for_ever():
    threading.Event().wait()


def test_after_it():
    assert True


def test_holds_the_interpreter(tmp_path):
    child = subprocess.Popen(["sleep", "600"])
    (tmp_path.parent.parent / "child.pid").write_text(str(child.pid))
    hold_the_interpreter()


def test_never_reached():
    assert True
"""


def test_a_hang_with_the_interpreter_held_ends_the_run_with_every_stack(tmp_path: Path) -> None:
    tests = tmp_path / "suite"
    tests.mkdir()
    (tests / "test_hangs.py").write_text(HANGS)
    env = {**os.environ, "SAGA_TEST_HANG_GRACE": "2", "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.run",
            "--no-services",
            "-c",
            "pyproject.toml",
            "-p",
            "tests.support.hang_watchdog",
            "-p",
            "no:cacheprovider",
            "-o",
            "timeout=1",
            "--basetemp",
            str(tmp_path / "base"),
            "-v",
            str(tests / "test_hangs.py"),
        ],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    # The plain hang failed alone, with a stack, and the run went on.
    assert "test_waits_for_ever FAILED" in out, out
    assert "test_after_it PASSED" in out, out
    # The held interpreter: faulthandler's dump of every thread, the frame that holds it ...
    assert "Timeout (0:00:03)!" in out, out
    assert "in hold_the_interpreter" in out, out
    assert "in test_holds_the_interpreter" in out, out
    # ... and one line that says which test and why.
    assert "pytest ended (exit 1) inside " in out, out
    assert "::test_holds_the_interpreter: it ran past its hard limit of 3 s" in out
    assert "test_never_reached" not in out
    # What the hung test started was ended.
    child = int((tmp_path / "child.pid").read_text())
    assert not alive(child)
    assert took < 60, took
