"""A pytest plugin that writes where each collected test runs in a split run.

``pytest --collect-only -p tests.support.phase_report`` with :data:`REPORT` naming a file: one
line per test, its id, the phases that keep it (``tests.support.phases.kept``) and its markers,
tab-separated. ``tests/unit/test_phases.py`` reads it: one collection tells every phase.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.phases import PHASES, kept

REPORT = "SAGA_TEST_PHASE_REPORT"


@pytest.hookimpl(trylast=True)  # after the Citus tests' conftest has marked them
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    lines = []
    for item in items:
        phases = ",".join(p for p in (*PHASES, "citus") if kept(item, p))
        markers = ",".join(sorted({m.name for m in item.iter_markers()}))
        lines.append(f"{item.nodeid}\t{phases}\t{markers}\n")
    Path(os.environ[REPORT]).write_text("".join(lines))
