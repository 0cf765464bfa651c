"""``make test`` keeps compiled modules even where the machine says not to write any.

A second pytest process (the serial phase after the parallel one, or the next run) then reads
the asserts pytest already rewrote instead of rewriting every test module again, and each
processor subprocess reads the engine compiled instead of compiling it again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.run import bytecode_cached


def test_the_runs_environment_keeps_compiled_modules_out_of_the_checkout(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "tiny_module.py").write_text("VALUE = 1\n")
    cache = tmp_path / "cache"
    machine = {"PYTHONDONTWRITEBYTECODE": "1", "SAGA_CACHE_DIR": str(cache), "PATH": "/usr/bin"}
    env = bytecode_cached(machine)

    done = subprocess.run(
        [sys.executable, "-c", "import tiny_module"],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert list((cache / "pycache").rglob("tiny_module.*.pyc")), "nothing was compiled"
    assert not list(source.rglob("*.pyc")), "compiled files went into the checkout"
    # What the machine asked for otherwise is kept.
    assert env["PATH"] == "/usr/bin"
    assert machine["PYTHONDONTWRITEBYTECODE"] == "1"
