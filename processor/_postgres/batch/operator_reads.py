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

from psycopg.types.numeric import Int4

from processor._engine.buckets import Buckets
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

    def __init__(self, tables: Tables, buckets: Buckets | None = None) -> None:
        r = tables.render
        self._buckets = buckets
        if buckets is None:
            self._held = r(sql.LOAD_HELD)
            self._deadlines = r(sql.LOAD_SAGA_DEADLINES)
            self._history = r(sql.LOAD_HISTORY)
            self._decided = r(sql.LOAD_DECIDED)
            return
        # Distributed by bucket: each read names one bucket, run once per bucket of the keys
        # (Citus plans these joins only on one shard); the bucket is the first parameter.
        by_keys = " WHERE bucket = %s::int AND (saga_type, saga_id) IN"
        self._held = r(sql.LOAD_HELD.replace("\n WHERE (saga_type, saga_id) IN", by_keys))
        self._deadlines = r(
            sql.LOAD_SAGA_DEADLINES.replace("\n WHERE (saga_type, saga_id) IN", by_keys)
        )
        self._history = r(sql.LOAD_HISTORY.replace("\n WHERE (saga_type, saga_id) IN", by_keys))
        self._decided = r(
            sql.LOAD_DECIDED.replace(
                "WHERE saga_type = k->>0", "WHERE bucket = %s::int AND saga_type = k->>0"
            )
        )
        for text in (self._held, self._deadlines, self._history, self._decided):
            assert "bucket" in text, text

    def send(self, conn: Conn, wants: Wants) -> list[Any]:
        """Sends the reads ``wants`` needs into the open pipeline; their cursors, each a list."""
        held, history = sorted(wants.held_keys), sorted(wants.history_keys)
        both = sorted(wants.held_keys | wants.history_keys)
        okeys = sorted(wants.operator_keys)
        buckets = self._buckets
        if buckets is None:
            return [
                [conn.execute(self._held, _columns(held))] if held else [],
                [conn.execute(self._deadlines, _columns(both))] if both else [],
                [conn.execute(self._history, _columns(history))] if history else [],
                [conn.execute(self._decided, (batch_rows.encode_message_keys(okeys),))]
                if okeys
                else [],
            ]

        def each(statement: str, keys: Sequence[SagaKey]) -> list[Any]:
            by: dict[int, list[SagaKey]] = {}
            for k in keys:
                by.setdefault(buckets.of(k[1]), []).append(k)
            return [conn.execute(statement, (Int4(b), *_columns(ks))) for b, ks in by.items()]

        decided: dict[int, list[tuple[str, str, str]]] = {}
        for k in okeys:
            decided.setdefault(buckets.of(k[1]), []).append(k)
        return [
            each(self._held, held),
            each(self._deadlines, both),
            each(self._history, history),
            [
                conn.execute(self._decided, (batch_rows.encode_message_keys(ks), Int4(b)))
                for b, ks in decided.items()
            ],
        ]

    @staticmethod
    def receive(cursors: list[Any]) -> OperatorRows:
        """The rows the cursors :meth:`send` returned read, once the pipeline is through."""
        c_held, c_deadlines, c_history, c_decided = (
            [row for c in group for row in c.fetchall()] for group in cursors
        )
        held: dict[SagaKey, list[HeldMessage]] = {}
        for t, i, *rest in c_held:
            held.setdefault((t, i), []).append(batch_rows.held_message(rest))
        deadlines = {
            did: DeadlineRef(t, i, n, due, payload, token)
            for did, t, i, n, due, payload, token in c_deadlines
        }
        return OperatorRows(
            held,
            frozenset((t, i, m) for t, i, m in c_decided),
            batch_rows.past_inputs(sorted(c_history, key=_history_order)),
            deadlines,
        )


def _history_order(row: Sequence[Any]) -> tuple[str, str]:
    # Rows of several buckets come bucket by bucket; each saga's own rows keep their id order.
    return (row[0], row[1])


def _columns(keys: Sequence[SagaKey]) -> tuple[list[str], list[str]]:
    return [k[0] for k in keys], [k[1] for k in keys]
