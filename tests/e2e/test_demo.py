"""`make demo` as a user runs it, in its quick form, against the already running services."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from devstack import ENV_DATABASE, ENV_KAFKA, Services

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

REPO = Path(__file__).resolve().parents[2]


def test_quick_demo_fires_a_timeout_and_conserves_money(services: Services) -> None:
    # With both variables set the demo starts nothing and stops nothing but its own processes.
    env = {
        **os.environ,
        ENV_KAFKA: services.kafka_bootstrap,
        ENV_DATABASE: services.database_url,
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, "-m", "demo", "--quick", "--timeout", "75"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=85,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    # librdkafka's own lines (`%6|1700000000.123|BGQUEUE|...`) go through logging, not raw.
    raw = [x for x in (out + done.stderr).splitlines() if re.match(r"%\d\|\d", x)]
    assert raw == [], raw
    fired = next(x for x in out.splitlines() if "timeouts fired:" in x)
    assert int(fired.split("timeouts fired:")[1].split()[0]) >= 1, out
    assert "timed out" in out, out
    assert "money conserved: sum of balances before" in out, out
    assert "2 processor replicas" in out, out
    # The order saga ran against the participant kit's services, each outcome at least once.
    tally = next(x for x in out.splitlines() if x.strip().startswith("order-saga"))
    assert "completed" in tally, out
    # Declined, flagged and unshippable orders were undone: compensated, not failed.
    assert "compensated" in tally, out
    assert "DO NOT ADD UP" not in tally, out
    # The trip saga written as one function ran beside them: booked, undone after a declined
    # charge, and failed with nothing to undo when no seat was left.
    trips = next(x for x in out.splitlines() if x.strip().startswith("trip-function"))
    for outcome in ("completed", "compensated", "failed"):
        assert outcome in trips, out
    assert "DO NOT ADD UP" not in trips, out
    # A remote customer's shipping failed on every try: a person was asked, and decided.
    assert "shipping escalated to a person 1 time(s)" in out, out
    # Nobody reviewed an unusual customer's order in time: a person rejected it.
    assert "fraud review escalated to a person 1 time(s)" in out, out
    # A slow bank captured after the payment timeout: the saga refunded it (money conserved).
    assert "payments captured by the slow bank after the saga gave up: 1, each refunded" in out
    # The console answered while the demo ran (its URL is printed only then).
    assert any(x.startswith("console: http://127.0.0.1:") for x in out.splitlines()), out
    metrics = next(x for x in out.splitlines() if x.startswith("metrics"))
    assert "replica 1: http://127.0.0.1:" in metrics, out
    assert "replica 2: http://127.0.0.1:" in metrics, out
