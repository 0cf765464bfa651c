"""Each test of a split run lands in exactly one phase (``tests.support.phases``), and the run
ends saying how long its phases took.

Collected by pytest itself, as ``make test`` collects: a test in no phase would never run, and a
test in two would run beside what it must not (a broker restart beside the end-to-end tests).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from tests.run import TERMINATED, Phase, first_failure, run_phases, summary
from tests.support.harness import wait_until
from tests.support.phase_report import REPORT
from tests.support.phases import (
    CITUS_LAYOUTS,
    LONGEST_FIRST,
    NOT_ON_CITUS_TESTS,
    PHASE,
    longest_first,
)

REPO = Path(__file__).resolve().parents[2]
FILES = (
    "tests/unit/test_run_bytecode.py",
    "tests/integration/test_stack_smoke.py",
    "tests/e2e/test_supervision.py",
    "tests/citus/test_citus_through_worker.py",
)
OUTAGE = "tests/citus/test_citus_worker_outage.py"


def _collected(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    collect = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*collect, *args],
        cwd=REPO,
        # Only the phase asked for: the run of this test has one of its own.
        env={**{k: v for k, v in os.environ.items() if k != PHASE}, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@dataclass(frozen=True)
class Placed:
    phases: tuple[str, ...]
    markers: frozenset[str]


@pytest.fixture(scope="module")
def placed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Placed]:
    """Each test of :data:`FILES` and the Citus outage tests: the phases that keep it, and its
    markers (what ``-m`` selects on), from one collection."""
    report = tmp_path_factory.mktemp("phases") / "report"
    plugin = ["-p", "tests.support.phase_report"]
    _collected(*plugin, *FILES, OUTAGE, env={REPORT: str(report)})
    out = {}
    for line in report.read_text().splitlines():
        nodeid, phases, markers = line.split("\t")
        out[nodeid] = Placed(tuple(filter(None, phases.split(","))), frozenset(markers.split(",")))
    return out


def test_every_test_runs_in_one_phase_and_the_broker_restart_runs_alone(
    placed: dict[str, Placed],
) -> None:
    def where(name: str) -> list[str]:
        # Each case of a parametrized test in the same phases.
        [phases] = {p.phases for i, p in placed.items() if i.split("::")[-1].startswith(name)}
        return [p for p in phases if p != "citus"]

    assert where("test_the_runs_environment_keeps_compiled_modules") == ["parallel"]
    assert where("test_postgres_commit_is_kept_and_rollback_is_not") == ["parallel"]
    assert where("test_a_loop_that_raises_ends_the_process_non_zero_within_seconds") == ["e2e"]
    broker_restart = (
        "tests/integration/test_stack_smoke.py::test_broker_restart_keeps_acknowledged_messages"
    )
    assert [i for i, p in placed.items() if "serial" in p.phases] == [broker_restart]
    # The Citus tests run in the citus phase only, where markers split them further; every
    # other test in exactly one phase.
    for nodeid, p in placed.items():
        if "citus" in p.markers:
            assert p.phases == ("citus",), nodeid
        else:
            assert len([x for x in p.phases if x != "citus"]) == 1, (nodeid, p)
    # How a phase deselects the rest, as make test runs it.
    serial = _collected(*FILES, env={PHASE: "serial"}).stdout.splitlines()
    assert [line for line in serial if "::" in line] == [broker_restart]


def test_the_citus_phase_runs_the_tests_that_stop_a_node_alone(placed: dict[str, Placed]) -> None:
    on_citus = {i.split("::")[-1]: p.markers for i, p in placed.items() if "citus" in p.phases}
    alone = {name for name, markers in on_citus.items() if "serial" in markers}
    assert "test_processes_through_the_worker_go_on_while_the_coordinator_is_down" in alone
    assert "test_the_other_workers_processor_commits_through_an_outage_and_nothing_is_lost" in alone
    # A schema moved under its own processes disturbs no other test.
    assert not any("schema_moves" in name for name in alone), alone
    paired = {name for name, markers in on_citus.items() if "e2e" in markers} - alone
    assert any("schema_moves" in name for name in paired), paired


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


def test_a_phase_beside_the_first_starts_the_one_it_chains_once_it_ends(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    ended = tmp_path / "second-ended"
    (tmp_path / "test_first.py").write_text("def test_first():\n    print('first runs')\n")
    (tmp_path / "test_second.py").write_text(
        f"import pathlib\ndef test_second():\n    pathlib.Path({str(ended)!r}).touch()\n"
    )
    # The chained phase sees what the one before it left: it started after it ended.
    (tmp_path / "test_third.py").write_text(
        f"import pathlib\ndef test_third():\n    assert pathlib.Path({str(ended)!r}).exists()\n"
    )
    alone = ["-c", os.devnull, "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-s"]
    env = dict(os.environ)

    def phase(name: str, then: Phase | None = None) -> Phase:
        return Phase(f"{name} phase", [*alone, str(tmp_path / f"test_{name}.py")], env, then)

    took: list[str] = []
    codes = run_phases([phase("first"), phase("second", then=phase("third"))], took)
    assert codes == [0, 0, 0]
    assert [t.split(" ")[0] for t in took] == ["first", "second", "third"]
    out = capfd.readouterr().out
    assert "first phase, beside it the second phase, then the third phase" in out
    assert out.index("output of the second phase:") < out.index("output of the third phase:")
    assert "third phase: exit 0 after" in out


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


def test_a_sigterm_ends_the_phases_under_way_and_the_run_starts_no_other(tmp_path: Path) -> None:
    started = tmp_path / "started"
    (tmp_path / "test_waits.py").write_text(
        "import pathlib, time\n"
        "def test_waits():\n"
        f"    pathlib.Path({str(started)!r}).touch()\n"
        "    time.sleep(600)\n"
    )
    alone = ["-c", os.devnull, "--rootdir", str(tmp_path), "-p", "no:cacheprovider"]
    phase = Phase("waiting phase", [*alone, str(tmp_path / "test_waits.py")], dict(os.environ))

    def platform() -> None:
        # As a platform stops a job: SIGTERM to the run, once its pytest runs the test.
        wait_until(started.exists, timeout=60, what="the test to start")
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=platform)
    sender.start()
    try:
        [code] = run_phases([phase], [])
        sender.join()
        assert code == -signal.SIGTERM
        assert TERMINATED.is_set()
    finally:
        TERMINATED.clear()


def test_the_citus_phase_runs_files_once_per_layout_and_no_case_without_postgresql() -> None:
    files = (
        "tests/e2e/test_crash_recovery.py",
        "tests/e2e/test_fencing.py",
        "tests/integration/test_retention.py",
        "tests/contract/test_producer_consumer_contract.py",
        "tests/contract/test_outbox_contract.py",
    )
    out = _collected(*files, env={PHASE: "citus"}).stdout.splitlines()
    ids = [line for line in out if "::" in line]
    layouts: dict[str, set[str]] = {line.split("::")[0]: set() for line in ids}
    for line in ids:
        case = line.split("[", 1)[1] if "[" in line else ""
        layouts[line.split("::")[0]].update(w for w in ("schema", "buckets") if w in case)
    assert layouts[files[0]] == {"schema", "buckets"}
    assert layouts[files[1]] == {"buckets"}
    assert layouts[files[2]] == {"buckets"}
    assert not any("fifty_thousand" in i for i in ids)
    # Each test left out is one of the files' tests: a renamed one would run again unnoticed.
    defined = "".join((REPO / path).read_text() for path in CITUS_LAYOUTS)
    assert [n for n in NOT_ON_CITUS_TESTS if f"def {n}(" not in defined] == []
    # Each test of a file with layouts runs once per layout.
    recovery = [i for i in ids if i.startswith(files[0])]
    assert len(recovery) == 2 * len(
        {
            i.replace("schema-", "")
            .replace("buckets-", "")
            .replace("[schema]", "")
            .replace("[buckets]", "")
            for i in recovery
        }
    )
    # The contract cases without a database ran in the parallel phase; PostgreSQL's run here.
    assert not any(f"[{case}" in i for i in ids for case in ("memory", "kafka", "sqlite"))
    assert any(i.startswith(files[4]) and "[postgres" in i for i in ids)
