"""The shutdown bound: a stop ends in time whether Python still runs or a native call holds it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

from processor._runtime.stopping import EXIT_OVERRAN, EXIT_STUCK, close_within
from tests.support.procs import REPO


def test_close_within_says_whether_the_close_ended_and_leaves_a_stuck_one_running() -> None:
    assert close_within("quick-close", lambda: None, 5.0)
    release = threading.Event()

    def stuck() -> None:
        release.wait()

    assert not close_within("stuck-close", stuck, 0.2)
    assert any(t.name == "stuck-close" and t.is_alive() for t in threading.enumerate())
    release.set()


def test_a_failing_close_counts_as_ended() -> None:
    def fail() -> None:
        raise RuntimeError("broker gone")

    assert close_within("failing-close", fail, 5.0)


def _run(body: str) -> subprocess.CompletedProcess[str]:
    script = "from processor._runtime.stopping import ShutdownBound\n" + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_stop_that_overruns_its_budget_exits_3_while_python_runs() -> None:
    done = _run(
        """
        import threading
        ShutdownBound(0.3, margin=30).arm()
        threading.Event().wait()  # a join that never returns
        """
    )
    assert done.returncode == EXIT_OVERRAN, done.stderr
    assert "Timeout (" not in done.stderr


def test_a_native_call_holding_the_interpreter_ends_with_every_stack_and_exit_1() -> None:
    done = _run(
        """
        from tests.support.stuck import hold_the_interpreter
        ShutdownBound(0.3, margin=0.3).arm()
        hold_the_interpreter()  # no timer thread can run now
        """
    )
    assert done.returncode == EXIT_STUCK, done.stderr
    assert "Timeout (0:00:00.600000)!" in done.stderr
    assert "in hold_the_interpreter" in done.stderr


def test_arming_twice_keeps_the_first_deadline() -> None:
    done = _run(
        """
        import threading, time
        bound = ShutdownBound(0.5, margin=30)
        bound.arm()
        time.sleep(0.3)
        bound.arm()  # must not push the deadline out
        threading.Event().wait(10)
        print("still here", flush=True)
        """
    )
    assert done.returncode == EXIT_OVERRAN
    assert "still here" not in done.stdout
