"""The batch load's reads for operator records: rows only a batch holding one needs.

A retry of a parked saga replays the records held behind it, with its deadline rows; a reset
rebuilds a saga from its history, with its deadline rows; any operator record is looked up among
those decided before (``rows.DECIDED``). Events never pay for these: each statement runs only
for a batch that names its keys, inside the load's one pipelined round trip
(:meth:`processor._postgres.batch.store.BatchSql.load`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from processor._engine.rows import DeadlineRef, HeldMessage, PastInput, SagaKey, Wants
from processor._postgres.batch import rows as batch_rows
from processor._postgres.batch import sql
from processor._postgres.held import Conn
from processor._postgres.schema.tables import Tables

__all__ = ["OperatorReads", "OperatorRows"]


@dataclass(frozen=True)
class OperatorRows:
    """What the operator reads found; ``deadlines`` adds to the batch's own."""

    held: Mapping[SagaKey, Sequence[HeldMessage]]
    decided: frozenset[tuple[str, str, str]]
    history: Mapping[SagaKey, Sequence[PastInput]]
    deadlines: Mapping[str, DeadlineRef]


class OperatorReads:
    """The statements, rendered once for the store's tables."""

    def __init__(self, tables: Tables) -> None:
        r = tables.render
        self._held = r(sql.LOAD_HELD)
        self._deadlines = r(sql.LOAD_SAGA_DEADLINES)
        self._history = r(sql.LOAD_HISTORY)
        self._decided = r(sql.LOAD_DECIDED)

    def send(self, conn: Conn, wants: Wants) -> list[Any]:
        """Sends the reads ``wants`` needs into the open pipeline; their cursors, or None each."""
        held, history = sorted(wants.held_keys), sorted(wants.history_keys)
        both = sorted(wants.held_keys | wants.history_keys)
        okeys = sorted(wants.operator_keys)
        return [
            conn.execute(self._held, _columns(held)) if held else None,
            conn.execute(self._deadlines, _columns(both)) if both else None,
            conn.execute(self._history, _columns(history)) if history else None,
            conn.execute(self._decided, (batch_rows.encode_message_keys(okeys),))
            if okeys
            else None,
        ]

    @staticmethod
    def receive(cursors: list[Any]) -> OperatorRows:
        """The rows the cursors :meth:`send` returned read, once the pipeline is through."""
        c_held, c_deadlines, c_history, c_decided = cursors
        held: dict[SagaKey, list[HeldMessage]] = {}
        for t, i, *rest in c_held.fetchall() if c_held is not None else ():
            held.setdefault((t, i), []).append(batch_rows.held_message(rest))
        deadlines = {
            did: DeadlineRef(t, i, n, due, payload, token)
            for did, t, i, n, due, payload, token in (
                c_deadlines.fetchall() if c_deadlines is not None else ()
            )
        }
        return OperatorRows(
            held,
            frozenset((t, i, m) for t, i, m in c_decided.fetchall()) if c_decided else frozenset(),
            batch_rows.past_inputs(c_history.fetchall()) if c_history is not None else {},
            deadlines,
        )


def _columns(keys: Sequence[SagaKey]) -> tuple[list[str], list[str]]:
    return [k[0] for k in keys], [k[1] for k in keys]
