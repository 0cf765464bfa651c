"""Operator view of state machine sagas: how many sit in each state, and for how long.

Age in a state is the signal: a RUNNING count whose oldest age keeps growing means step timers
are not firing; any TIMED_OUT or COMPENSATION_FAILED row is work for a person. Ended sagas count
under their outcome: COMPENSATED (undone cleanly) and FAILED (nothing undone) need nobody. An
orchestrated saga whose undo ran out of retries is not COMPENSATION_FAILED: it stays WAITING on a
person (``parked`` lists it with the failed undo) until ``saga resolve ... retry|skip``.
"""

from __future__ import annotations

from dataclasses import dataclass

from processor._ports import OperatorStore, StateCount

__all__ = ["ATTENTION", "MachineSummary", "StateCount", "machine_summary"]

ATTENTION = ("TIMED_OUT", "COMPENSATION_FAILED")


@dataclass(frozen=True, slots=True)
class MachineSummary:
    """Counts per state and the totals that need a person.

    Attributes:
        states: One row per (saga type, machine state), ordered by both.
        timed_out: Instances in TIMED_OUT.
        compensation_failed: Instances in COMPENSATION_FAILED.
    """

    states: list[StateCount]
    timed_out: int
    compensation_failed: int


def machine_summary(store: OperatorStore, saga_type: str | None = None) -> MachineSummary:
    """Group state machine sagas by machine state.

    Args:
        store: The processor's database, e.g. `processor._postgres.reads.operator.OperatorQueries`.
        saga_type: Only this saga type; None for all.
    """
    rows = store.machine_states(saga_type)
    totals = {a: sum(r.count for r in rows if r.machine_state == a) for a in ATTENTION}
    return MachineSummary(rows, totals["TIMED_OUT"], totals["COMPENSATION_FAILED"])
