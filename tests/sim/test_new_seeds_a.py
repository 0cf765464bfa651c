"""New schedules every run: one of the two parts of make test's simulation budget.

The seeds start at SAGA_TEST_SIM_SEED_BASE, drawn afresh each run and printed in pytest's header
(tests/conftest.py); set it to run the same seeds again.
"""

from __future__ import annotations

import pytest

from tests.sim.budget import hold_every_invariant

pytestmark = pytest.mark.slow


def test_new_schedules_hold_every_invariant() -> None:
    hold_every_invariant(part=0)
