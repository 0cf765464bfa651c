"""Operator view of state machine sagas: how many sit in each state, and for how long.

Age in a state is the signal: a RUNNING count whose oldest age keeps growing means step timers
are not firing; any TIMED_OUT or COMPENSATION_FAILED row is work for a person.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import timedelta

from processor.cli import command, ops_connection, text_table
from processor.postgres.schema import Tables
from processor.postgres.store import Conn
from processor.settings import ProcessorSettings

__all__ = ["MachineSummary", "StateCount", "machine_summary"]

ATTENTION = ("TIMED_OUT", "COMPENSATION_FAILED")


@dataclass(frozen=True, slots=True)
class StateCount:
    """Sagas of one type in one machine state.

    Attributes:
        saga_type: Saga type name.
        machine_state: The machine state.
        count: How many instances are in it.
        oldest: Longest time an instance has been in it (database clock).
    """

    saga_type: str
    machine_state: str
    count: int
    oldest: timedelta


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


def machine_summary(conn: Conn, tables: Tables, saga_type: str | None = None) -> MachineSummary:
    """Group state machine sagas by machine state.

    Args:
        conn: A connection to the processor's database.
        tables: The processor's table names.
        saga_type: Only this saga type; None for all.
    """
    sql = tables.render(
        """
        SELECT saga_type, machine_state, count(*),
               now() - min(coalesce(machine_state_since, created_at))
          FROM {instance}
         WHERE machine_state IS NOT NULL AND (%s::text IS NULL OR saga_type = %s::text)
         GROUP BY saga_type, machine_state
         ORDER BY saga_type, machine_state
        """
    )
    rows = [
        StateCount(t, s, int(n), max(age, timedelta(0)))
        for t, s, n, age in conn.execute(sql, (saga_type, saga_type)).fetchall()
    ]
    totals = {a: sum(r.count for r in rows if r.machine_state == a) for a in ATTENTION}
    return MachineSummary(rows, totals["TIMED_OUT"], totals["COMPENSATION_FAILED"])


def format_summary(summary: MachineSummary) -> str:
    """Render the summary as a fixed-width table followed by the attention totals."""
    table = text_table(
        ("SAGA TYPE", "MACHINE STATE", "COUNT", "OLDEST"),
        (
            (r.saga_type, r.machine_state, str(r.count), str(r.oldest).split(".")[0])
            for r in summary.states
        ),
    )
    totals = f"TIMED_OUT: {summary.timed_out}  COMPENSATION_FAILED: {summary.compensation_failed}"
    return f"{table}\n{totals}"


def _states_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--saga-type", default=None, help="only this saga type")


def states_command(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Prints sagas per machine state with the age of the oldest; exit code 0."""
    conn, tables = ops_connection(settings)
    with conn:
        summary = machine_summary(conn, tables, args.saga_type)
    print(format_summary(summary))
    return 0


command(
    "states",
    "count state machine sagas per machine state, with the oldest age",
    arguments=_states_arguments,
)(states_command)
