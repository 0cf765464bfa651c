"""The two phases of a split run (``python -m tests.run --split``, what ``make test`` does)."""

from __future__ import annotations

import pytest

PHASE = "SAGA_TEST_PHASE"
"""``parallel`` or ``serial``: which half of the suite a pytest process runs."""


def alone(item: pytest.Item) -> bool:
    """Whether ``item`` runs in the serial phase: end-to-end, or disturbing shared services.

    End-to-end tests run several processes each and measure bounds in seconds (a shutdown
    budget, a lease, a session timeout); they run one at a time so that a second test's load
    never eats their margins.
    """
    return "e2e" in item.path.parts or item.get_closest_marker("serial") is not None
