"""S10's saga, as every engine runs it: what is shared by the three sides, and nothing else.

A transfer: debit the source (the "reserve" step), credit the target (the "charge" step), and
when the credit is refused, reverse the debit (the compensation) and end compensated. Which
credits are refused is decided from the transfer id alone, by hashing, so that each engine
compensates the same share of its sagas and a redelivered or retried step decides as the
first try did. The steps' own work is this decision and nothing more, on every engine.

Pure: imported by the engine's side and by the peers' child processes, in either virtualenv.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from benchmarks.common import percentile

# One credit in ten is refused: enough that compensation is part of what is measured, few
# enough that the happy path sets the pace, as in production.
REFUSED_SHARE = 0.1
# The states a saga ends in, by how its credit went.
COMPLETED = "COMPLETED"
COMPENSATED = "COMPENSATED"


def credit_refused(transfer_id: str, share: float = REFUSED_SHARE) -> bool:
    """Whether the target refuses this transfer's credit (stable for a given id)."""
    digest = hashlib.sha256(transfer_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def transfer_ids(run_id: str, count: int, first: int = 0) -> list[str]:
    """The transfer ids of a run: one per saga, unique across the runs' phases by ``first``."""
    return [f"tr-{run_id}-{n:08d}" for n in range(first, first + count)]


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max of start-to-end latencies given in seconds, in milliseconds."""
    ms = sorted(s * 1000 for s in seconds)
    return {
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "max_ms": ms[-1] if ms else float("nan"),
        "sagas": float(len(ms)),
    }


def half_rate(sagas_per_s: float, floor: float = 1.0) -> float:
    """The latency phase's start rate: half of a side's own saturation rate, at least ``floor``."""
    return max(floor, sagas_per_s / 2)
