"""The Temporal development server for S10: found or built, started on loopback, stopped.

The server is the Temporal CLI's ``server start-dev`` (the frontend, history, matching and
worker services in one process, on SQLite). No prebuilt binary can be downloaded here, so it is
built from source with ``go install`` of a pinned CLI release (the newest one does not build
with this toolchain) into the benchmarks' cache, once; ``SAGA_BENCH_TEMPORAL`` names a binary
to use instead. Without either, and with no ``go`` on PATH, the peer is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import RESULTS_DIR, say

CLI_MODULE = "github.com/temporalio/cli/cmd/temporal"
CLI_VERSION = "v1.5.1"
CACHE = RESULTS_DIR.parent / "cache" / f"temporal-cli-{CLI_VERSION}"
ENV = "SAGA_BENCH_TEMPORAL"
# A cold build takes about six minutes of one core; the deadline leaves room for a busy box.
BUILD_DEADLINE = 40 * 60.0
READY_DEADLINE = 90.0
STOP_DEADLINE = 20.0


class Unavailable(Exception):
    """The server cannot be had on this machine; the message says why."""


def binary() -> Path:
    """The ``temporal`` binary: named by ``SAGA_BENCH_TEMPORAL``, cached, or built now.

    Raises:
        Unavailable: None is named or cached, and there is no ``go`` to build one.
    """
    named = os.environ.get(ENV)
    if named:
        if not Path(named).is_file():
            raise Unavailable(f"{ENV}={named} is not a file")
        return Path(named)
    cached = CACHE / "bin" / "temporal"
    if cached.is_file():
        return cached
    go = shutil.which("go")
    if go is None:
        raise Unavailable(
            f"no Temporal CLI in {cached} and no `go` on PATH to build it "
            f"(`go install {CLI_MODULE}@{CLI_VERSION}`), nor {ENV} naming one"
        )
    _build(go, cached)
    return cached


def _build(go: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    say(
        f"building the Temporal CLI {CLI_VERSION} into {target.parent} with `go install` "
        "(once; about six minutes of one core)"
    )
    log = target.parent.parent / "build.log"
    env = {**os.environ, "GOBIN": str(target.parent)}
    with open(log, "wb") as out:
        build = subprocess.Popen(
            [go, "install", f"{CLI_MODULE}@{CLI_VERSION}"], env=env, stdout=out, stderr=out
        )
        started = time.monotonic()
        while True:
            try:
                build.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - started
                if elapsed > BUILD_DEADLINE:
                    build.kill()
                    build.wait(10)
                    raise Unavailable(
                        f"`go install` of the Temporal CLI ran past {BUILD_DEADLINE:.0f} s; "
                        f"see {log}"
                    ) from None
                say(f"  still building the Temporal CLI ({elapsed:.0f} s; log {log})")
    if build.returncode != 0 or not target.is_file():
        tail = log.read_text(errors="replace")[-1500:]
        raise Unavailable(f"`go install` of the Temporal CLI failed ({build.returncode}): {tail}")
    say(f"  built {target}")


def version(path: Path) -> str:
    """What the binary says of itself (a source build says the server's and UI's versions)."""
    done = subprocess.run(
        [str(path), "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    return done.stdout.strip() or done.stderr.strip()


def free_port() -> int:
    """A loopback port free now (the server binds it a moment later; a clash fails loudly)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Server:
    """A running dev server: where it answers and the process whose CPU is its cost."""

    address: str
    pid: int
    version: str
    db: str


@contextmanager
def dev_server(path: Path) -> Iterator[Server]:
    """Starts ``temporal server start-dev`` on loopback, waits until it serves, stops it after.

    Its state is a SQLite file in a temporary directory (on disk, as the other engines' state
    is), removed with it.
    """
    port, ui_port, http_port, metrics_port = (free_port() for _ in range(4))
    with tempfile.TemporaryDirectory(prefix="bench-temporal-") as tmp:
        db = str(Path(tmp) / "temporal.db")
        log_path = RESULTS_DIR / "logs" / f"temporal-{port}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    str(path),
                    "server",
                    "start-dev",
                    "--headless",
                    "--ip",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--ui-port",
                    str(ui_port),
                    "--http-port",
                    str(http_port),
                    "--metrics-port",
                    str(metrics_port),
                    "--db-filename",
                    db,
                    "--log-level",
                    "warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            try:
                address = f"127.0.0.1:{port}"
                _wait_ready(path, address, proc, log_path)
                yield Server(address, proc.pid, version(path), db)
            finally:
                _stop(proc)


def _wait_ready(path: Path, address: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until the default namespace answers (the dev server registers it once it serves)."""
    deadline = time.monotonic() + READY_DEADLINE
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Unavailable(f"the Temporal dev server exited ({proc.returncode}); see {log}")
        check = subprocess.run(
            [str(path), "operator", "namespace", "describe", "default", "--address", address],
            capture_output=True,
            timeout=30,
            check=False,
        )
        if check.returncode == 0:
            return
        # The probe's pace: each is a process start, and the server is busy starting too.
        time.sleep(0.5)
    raise Unavailable(f"the Temporal dev server did not serve within {READY_DEADLINE:.0f} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
