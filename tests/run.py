"""Runs the test suite as `make test` does, and leaves nothing behind however pytest ends.

1. Finds or starts Kafka, PostgreSQL (``devstack.provide``) and a Schema Registry
   (``devstack.provide_registry``) and hands them to pytest through the ``SAGA_TEST_*``
   variables, so their start-up is no test's time.
2. Runs pytest in a child process; every process of the run carries :data:`MARK` in its
   environment (the child processes that tests start, the services the run started).
3. Afterwards, whether pytest ended normally, on a hang (``tests/support/hang_watchdog.py`` ends
   it with every thread's stack) or killed: says which test it was in if it died inside one,
   ends every process still marked, and stops the services that step 1 started (those carry
   no mark: they outlive each phase, and a test that restarts one starts it unmarked).

With ``--split`` (what ``make test`` does) pytest runs in phases: the unit, contract and
integration tests on four workers, the end-to-end tests two at a time, the tests that disturb
the shared services alone, then the Citus tests against a Citus coordinator where one can be
had (:func:`run_split`).

``python -m tests.run [--no-services] [--split] [PYTEST ARGS]``; the exit code is pytest's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from devstack import (
    ENV_ALLOW_REGISTRY_RESTART,
    ENV_ALLOW_RESTART,
    ENV_DATABASE,
    ENV_KAFKA,
    ENV_SCHEMA_REGISTRY,
    TEST_RUN_MARK,
    cache_dir,
    provide,
    provide_citus,
    provide_registry,
)
from tests.support.hang_watchdog import CURRENT_FILE
from tests.support.phases import (
    CITUS_TESTS,
    PHASE,
    PHASES,
)
from tests.support.procs import alive

MARK = TEST_RUN_MARK
# Workers of the parallel phase of a split run (``--split``). The machines CI runs on have two
# cores, and the tests of that phase mostly wait on the services: two workers left the cores
# idle half the time, four a third of it (a tenth in the Citus phase).
WORKERS = os.environ.get("SAGA_TEST_WORKERS", "4")
# End-to-end tests at once. Each runs several processes and measures bounds in seconds, with
# slack for a loaded two-core machine; one at a time left the cores idle two thirds of the time.
E2E_WORKERS = "2"


def _echo(line: str) -> None:
    print(f"[tests.run] {line}", flush=True)


def marked(mark: str) -> list[int]:
    """Processes other than this one whose environment carries ``MARK=mark``."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def _describe(pid: int) -> str:
    with contextlib.suppress(OSError):
        args = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
        main = next((a for a in reversed(args) if a and not a.startswith(b"-")), b"?")
        return f"{pid} ({main.decode(errors='replace')[-60:]})"
    return str(pid)


def end_marked(mark: str, grace: float = 10.0) -> int:
    """SIGTERM, then SIGKILL past ``grace``, for every process of the run; returns how many."""
    pids = marked(mark)
    if pids:
        _echo("left behind: " + ", ".join(_describe(p) for p in pids))
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def bytecode_cached(env: dict[str, str]) -> dict[str, str]:
    """``env`` with compiled modules kept (under the cache directory, out of the checkout).

    A machine that sets ``PYTHONDONTWRITEBYTECODE`` makes every pytest process rewrite the
    asserts of every test module again (14 s of one core per collection) and every processor
    subprocess compile the engine again; one run starts two pytest phases and a few hundred
    subprocesses.
    """
    kept = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    kept.setdefault("PYTHONPYCACHEPREFIX", str(cache_dir(env) / "pycache"))
    return kept


class Pytest:
    """One pytest process of the run, started at once; :meth:`finish` waits for it and cleans up.

    Args:
        args: pytest's arguments.
        env: Its environment (with compiled modules kept, and :data:`MARK` added).
        output: Where its output goes, when not to this process's.
    """

    def __init__(self, args: Sequence[str], env: dict[str, str], output: IO[str] | None = None):
        self.mark = uuid.uuid4().hex
        with tempfile.NamedTemporaryFile("w+", prefix="saga-test-current-", delete=False) as f:
            self.current = Path(f.name)
        env = {**bytecode_cached(env), MARK: self.mark, CURRENT_FILE: str(self.current)}
        self.child = subprocess.Popen(
            [sys.executable, "-m", "pytest", *args],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
        )

    def finish(self) -> int:
        """pytest's exit code, once it has ended; reports a test it died in and ends what is
        left of its processes."""
        code = self.child.wait()
        current = self.current
        for path in [current, *current.parent.glob(current.name + ".*")]:
            died_in = path.read_text().split("\n") if path.exists() else []
            path.unlink(missing_ok=True)
            if not died_in or not died_in[0]:
                continue
            _echo(
                f"pytest ended (exit {code}) inside {died_in[0]}: it ran past its hard limit of "
                f"{died_in[1]} s (its timeout plus a grace), so a thread held the interpreter and "
                "only faulthandler's watchdog could act: every thread's stack is above"
                if code == 1
                else f"pytest ended (exit {code}) inside {died_in[0]}"
            )
            code = code or 1
        left = end_marked(self.mark)
        if left:
            _echo(f"ended {left} process(es) the run left behind")
        return code


# Set once a SIGTERM has reached the run: the phases not yet started do not start.
TERMINATED = threading.Event()


@contextlib.contextmanager
def passing_signals_to(runs: Sequence[Pytest]) -> Iterator[None]:
    """Ctrl-C reaches pytest too (one process group): it stops the run, this waits for it. A
    platform's SIGTERM is passed on to every pytest in ``runs``, and the clean-up still runs.

    Enter it once they have started: an ignored SIGINT would be inherited by them.
    """

    def terminate(*_: object) -> None:
        TERMINATED.set()
        for run in runs:
            run.child.terminate()

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    before = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, before)


def run_pytest(args: Sequence[str], env: dict[str, str]) -> int:
    """Runs pytest with ``args``; afterwards reports a test it died in and ends what is left."""
    run = Pytest(args, env)
    with passing_signals_to([run]):
        return run.finish()


@contextlib.contextmanager
def services(echo: bool = True) -> Iterator[dict[str, str]]:
    """The environment that points pytest at running services (started here if need be)."""
    say = _echo if echo else (lambda _line: None)
    with provide(say) as found, provide_registry(say) as registry:
        env = {
            **os.environ,
            ENV_KAFKA: found.kafka_bootstrap,
            ENV_DATABASE: found.database_url,
            ENV_SCHEMA_REGISTRY: registry.url,
        }
        if found.restart_kafka is not None:
            # This run started the broker: tests may restart it.
            env[ENV_ALLOW_RESTART] = "1"
        if registry.stop is not None:
            # This run started the registry: tests may stop and start it. It is stopped here,
            # at the end of the run, however pytest ended.
            env[ENV_ALLOW_REGISTRY_RESTART] = "1"
        yield env


# pytest's exit code when it collected nothing: one phase of a split run may have no tests.
NO_TESTS = 5


# What the phases of ``make test`` may take on a two-core machine (the project's standard); a
# split run that takes longer says so at its end.
BUDGET_S = 12 * 60


def _workers(count: str, *, longest_first: bool = False) -> list[str]:
    """pytest-xdist's arguments for ``count`` workers, each taking whole files.

    pytest-xdist hands out the files with most tests first, which in the parallel phase mixes
    the many short unit tests with the integration tests that run processes (in the order of
    the collection, 4 of those at once took a fifth longer). ``longest_first`` hands them out
    in the order of the collection instead, where the end-to-end files that take longest come
    first (``tests.support.phases.longest_first``).
    """
    order = ["--no-loadscope-reorder"] if longest_first else []
    return ["-n", count, "--dist", "loadfile", *order]


@dataclass(frozen=True)
class Phase:
    """One pytest run of a split run: its name, arguments and environment, and the phase to
    start once it ends (beside the first phase of :func:`run_phases`, in the same lane)."""

    name: str
    args: Sequence[str]
    env: dict[str, str]
    then: Phase | None = None

    def chain(self) -> list[Phase]:
        """This phase and those it starts after it, in order."""
        return [self, *(self.then.chain() if self.then is not None else [])]


def first_failure(codes: Sequence[int]) -> int:
    if codes and all(c == NO_TESTS for c in codes):
        return NO_TESTS
    return next((c for c in codes if c not in (0, NO_TESTS)), 0)


def run_phases(phases: Sequence[Phase], took: list[str]) -> list[int]:
    """Runs ``phases`` at once, each with the phases it chains (``Phase.then``) after it, and
    returns their exit codes; notes their times in ``took``.

    The first one's output comes here as it runs; each other's is kept in a file and printed
    once all have ended, so that their lines do not interleave. After a SIGTERM no chained
    phase starts.
    """
    first, *beside = phases
    lanes = [p.chain() for p in phases]
    others = [p for lane in lanes for p in lane][1:]
    _echo(first.name + "".join(f", beside it the {p.name}" for p in beside)
          + "".join(f", then the {p.name}" for lane in lanes for p in lane[1:]))  # fmt: skip
    started = time.monotonic()
    ended: dict[str, tuple[int, float]] = {}
    runs: list[Pytest] = []
    with contextlib.ExitStack() as files:
        outputs = {p.name: files.enter_context(tempfile.TemporaryFile("w+")) for p in others}

        def lane(chain: list[Phase], first_run: Pytest) -> None:
            run, since = first_run, started
            for i, phase in enumerate(chain):
                if i:
                    if TERMINATED.is_set():
                        _echo(f"stopped by SIGTERM: the {phase.name} does not start")
                        return
                    since = time.monotonic()
                    run = Pytest(phase.args, phase.env, outputs[phase.name])
                    runs.append(run)
                code = run.finish()
                ended[phase.name] = (code, time.monotonic() - since)

        for chain in lanes:
            head = chain[0]
            runs.append(Pytest(head.args, head.env, outputs.get(head.name)))
        waiting = [
            threading.Thread(target=lane, args=(chain, run), name=chain[0].name)
            for chain, run in zip(lanes, list(runs), strict=True)
        ]
        with passing_signals_to(runs):
            for thread in waiting:
                thread.start()
            for thread in waiting:
                thread.join()
        for phase in others:
            out = outputs[phase.name]
            out.seek(0)
            _echo(f"output of the {phase.name}:")
            sys.stdout.write(out.read())
            sys.stdout.flush()
    for phase in [first, *others]:
        if phase.name not in ended:
            continue
        code, seconds = ended[phase.name]
        _echo(f"{phase.name}: exit {code} after {seconds:.0f} s")
        name = phase.name.replace(" phase", "")
        beside_first = f" (beside {first.name})" if phase is not first else ""
        took.append(f"{name} {seconds:.0f} s{beside_first}")
    return [ended[p.name][0] for p in [first, *others] if p.name in ended]


def run_split(args: Sequence[str], env: dict[str, str]) -> int:
    """Runs the suite in phases (``tests.support.phases.phase_of``); the exit code is the
    first failing phase's.

    1. ``parallel``: unit, contract and integration tests on :data:`WORKERS` pytest-xdist
       workers: they wait on the services far more than they compute, and each uses topics,
       groups and schemas of its own.
    2. ``e2e``: the end-to-end tests, :data:`E2E_WORKERS` at a time. Beside them, the Citus
       tests that stop a node of the Citus cluster (only Citus tests use it, and these spend
       their time waiting through the outage), then the other end-to-end Citus tests
       (:data:`CITUS_TESTS`), two at a time: the plain ones leave the cores idle two fifths
       of their time.
    3. ``serial``: the tests that disturb the shared services, alone.
    4. The Citus tests that are not end-to-end, on :data:`WORKERS` workers. A test of a file
       in :data:`CITUS_LAYOUTS` runs once per layout it names there.

    Steps 2 and 4 run Citus tests only when the whole suite runs, not some of its files. Citus
    is not in Debian's packages: on a machine without it the run says how many tests it skipped
    and why, and passes.
    """
    started = time.monotonic()
    codes: list[int] = []
    took: list[str] = []
    workers = {
        "parallel": _workers(WORKERS),
        "e2e": _workers(E2E_WORKERS, longest_first=True),
        "serial": [],
    }
    plain = {
        phase: Phase(f"{phase} phase", [*workers[phase], *args], {**env, PHASE: phase})
        for phase in PHASES
    }
    whole = not any(not a.startswith("-") for a in args)
    with provide_citus(_echo) if whole else contextlib.nullcontext() as citus:
        url = citus.url if citus is not None else None
        on_citus = url is not None
        if citus is not None and not on_citus:
            count = collected([*CITUS_TESTS, *args], {**env, PHASE: "citus"})
            _echo(f"citus phase: skipped {count} tests: {citus.reason}")
        # Used only on_citus.
        citus_env = {**env, ENV_DATABASE: url or "", PHASE: "citus"}

        def on_coordinator(part: str, extra: Sequence[str]) -> Phase:
            return Phase(f"citus phase{part}", [*extra, *CITUS_TESTS, *args], citus_env)

        # Beside the plain end-to-end tests, which leave the cores idle two fifths of the time:
        # the Citus tests that stop a node (they wait through the outage), then the Citus
        # end-to-end tests, two at a time, once no node is stopped.
        end_to_end = on_coordinator(
            " (end-to-end)",
            [*_workers(E2E_WORKERS, longest_first=True), "-m", "e2e and not serial"],
        )
        alone = on_coordinator(" (alone)", ["-m", "serial"])
        stages = [
            [plain["parallel"]],
            [plain["e2e"], *([replace(alone, then=end_to_end)] if on_citus else [])],
            [plain["serial"]],
        ]
        if on_citus:
            stages += [[on_coordinator("", [*_workers(WORKERS), "-m", "not e2e and not serial"])]]
        for stage in stages:
            if TERMINATED.is_set():
                _echo("stopped by SIGTERM: the phases after it do not run")
                break
            codes += run_phases(stage, took)
    _echo(summary(took, time.monotonic() - started))
    return first_failure(codes)


def summary(took: Sequence[str], seconds: float) -> str:
    """The last line of a split run: each phase's time, the total, and whether it is over
    :data:`BUDGET_S`."""
    over = f", over the budget of {BUDGET_S // 60} minutes" if seconds > BUDGET_S else ""
    return f"phases took {', '.join(took)}: {seconds:.0f} s in all{over}"


def collected(args: Sequence[str], env: dict[str, str]) -> int:
    """How many tests pytest would run with ``args``."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *args],
        env=bytecode_cached(env),
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return sum("::" in line for line in out.splitlines())


# The PostgreSQL clusters that the run starts (its private stacks' too) skip fsync (see
# deploy/local/common.sh): the tests kill processes, never the machine, and creating a schema
# took half as long (a Citus one 0.35 s instead of 0.7 s). Set it to "on" to keep fsync.
FSYNC = "SAGA_LOCAL_PG_FSYNC"
# And without TLS on their loopback connections: a run opens some 15,000 connections to
# PostgreSQL in its parallel phase alone, each a TLS handshake on both sides otherwise.
SSL = "SAGA_LOCAL_PG_SSL"


def main(argv: Sequence[str]) -> int:
    os.environ.setdefault(FSYNC, "off")
    os.environ.setdefault(SSL, "off")
    args = list(argv)
    split = "--split" in args
    if split:
        args.remove("--split")
    run = run_split if split else run_pytest
    if "--no-services" in args:
        args.remove("--no-services")
        return run(args, dict(os.environ))
    with services() as env:
        return run(args, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
