"""``make test`` keeps compiled test modules even where the machine says not to write any.

A second pytest process (the serial phase after the parallel one, or the next run) then reads
the asserts pytest already rewrote instead of rewriting every test module again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.procs import REPO

TINY = """
def test_it():
    assert 1 + 1 == 2
"""


def test_a_run_keeps_its_rewritten_test_modules_despite_pythondontwritebytecode(
    tmp_path: Path,
) -> None:
    tests = tmp_path / "suite"
    tests.mkdir()
    (tests / "test_tiny_module.py").write_text(TINY)
    cache = tmp_path / "cache"
    env = {
        **os.environ,
        "PYTHONDONTWRITEBYTECODE": "1",
        "SAGA_CACHE_DIR": str(cache),
        "PYTHONPATH": str(REPO),
    }
    env.pop("PYTHONPYCACHEPREFIX", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.run",
            "--no-services",
            "-c",
            "pyproject.toml",
            "-p",
            "no:cacheprovider",
            "--basetemp",
            str(tmp_path / "base"),
            "-q",
            str(tests / "test_tiny_module.py"),
        ],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # pytest's own tag marks a module whose asserts it rewrote.
    kept = list((cache / "pycache").rglob("test_tiny_module.*pytest*.pyc"))
    assert kept, sorted(str(p) for p in (cache / "pycache").rglob("*.pyc"))[:20]
    assert not list(tests.rglob("*.pyc")), "compiled files went into the checkout"
