"""Each test of a split run lands in exactly one phase (``tests.support.phases``), and the run
ends saying how long its phases took.

Collected by pytest itself, as ``make test`` collects: a test in no phase would never run, and a
test in two would run beside what it must not (a broker restart beside the end-to-end tests).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from tests.run import Phase, first_failure, run_phases, summary
from tests.support.phases import LONGEST_FIRST, PHASE, PHASES, longest_first

REPO = Path(__file__).resolve().parents[2]
FILES = (
    "tests/unit/test_run_bytecode.py",
    "tests/integration/test_stack_smoke.py",
    "tests/e2e/test_supervision.py",
    "tests/citus/test_citus_through_worker.py",
)


def _collected(phase: str, *args: str) -> set[str]:
    """The ids pytest collects in ``phase`` from ``args`` (default :data:`FILES`)."""
    collect = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*collect, *(args or FILES)],
        cwd=REPO,
        env={**os.environ, PHASE: phase},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_every_test_runs_in_one_phase_and_the_broker_restart_runs_alone() -> None:
    phases = {phase: _collected(phase) for phase in PHASES}

    def where(name: str) -> list[str]:
        return [p for p, ids in phases.items() if any(name in i for i in ids)]

    assert where("test_the_runs_environment_keeps_compiled_modules") == ["parallel"]
    assert where("test_postgres_commit_is_kept_and_rollback_is_not") == ["parallel"]
    assert where("test_a_loop_that_raises_ends_the_process") == ["e2e"]
    assert phases["serial"] == {
        "tests/integration/test_stack_smoke.py::test_broker_restart_keeps_acknowledged_messages"
    }
    # The Citus tests run in the citus phase only, where markers split them further.
    assert where("test_citus_through_worker") == []
    everything = [i for ids in phases.values() for i in ids]
    assert len(everything) == len(set(everything))


def test_the_citus_phase_runs_the_tests_that_stop_a_node_alone() -> None:
    outage, through_worker = "tests/citus/test_citus_worker_outage.py", FILES[-1]
    alone = {i.split("::")[-1] for i in _collected("citus", "-m", "serial", outage, through_worker)}
    assert "test_processes_through_the_worker_go_on_while_the_coordinator_is_down" in alone
    assert "test_the_other_workers_processor_commits_through_an_outage_and_nothing_is_lost" in alone
    # A schema moved under its own processes disturbs no other test.
    assert not any("schema_moves" in name for name in alone), alone
    paired = _collected("citus", "-m", "e2e and not serial", through_worker)
    assert any("schema_moves" in i for i in paired), paired


def test_a_split_run_ends_with_its_phases_times_and_says_when_it_is_over_budget() -> None:
    took = ["parallel 132 s", "e2e 268 s"]
    assert summary(took, 400.4) == "phases took parallel 132 s, e2e 268 s: 400 s in all"
    assert summary(took, 721).endswith(": 721 s in all, over the budget of 12 minutes")


def test_phases_run_at_once_and_the_one_beside_prints_its_output_after(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "test_passes.py").write_text("def test_passes():\n    print('first runs')\n")
    (tmp_path / "test_fails.py").write_text("def test_fails():\n    assert 'beside' == 'fails'\n")
    alone = ["-c", os.devnull, "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-s"]
    env = dict(os.environ)
    took: list[str] = []
    codes = run_phases(
        [
            Phase("first phase", [*alone, str(tmp_path / "test_passes.py")], env),
            Phase("second phase", [*alone, str(tmp_path / "test_fails.py")], env),
        ],
        took,
    )
    assert codes == [0, 1]
    assert first_failure(codes) == 1
    assert [t.split(" ")[0] for t in took] == ["first", "second"]
    assert took[1].endswith(" s (beside first phase)")
    out = capfd.readouterr().out
    # The first phase's output, then the second's, whole, after it.
    assert out.index("first runs") < out.index("output of the second phase:")
    assert out.index("output of the second phase:") < out.index("'beside' == 'fails'")
    assert "second phase: exit 1 after" in out


def test_a_split_run_fails_with_the_first_failing_phase_and_is_empty_only_if_all_are() -> None:
    assert first_failure([0, 5, 2, 1]) == 2
    assert first_failure([5, 0]) == 0
    assert first_failure([5, 5]) == 5


def test_the_longest_end_to_end_files_go_first_in_their_order_and_all_exist() -> None:
    root = Path("/repo")

    def item(path: str) -> pytest.Item:
        return cast(pytest.Item, SimpleNamespace(path=root / path))

    first, second = LONGEST_FIRST[:2]
    items = [item("tests/e2e/test_app.py"), item(second), item("tests/e2e/test_zz.py")]
    items += [item(first), item(second)]
    ordered = [i.path.relative_to(root).as_posix() for i in longest_first(items, root)]
    assert ordered == [first, second, second, "tests/e2e/test_app.py", "tests/e2e/test_zz.py"]
    # A file renamed or removed would silently lose its place.
    assert [p for p in LONGEST_FIRST if not (REPO / p).is_file()] == []
