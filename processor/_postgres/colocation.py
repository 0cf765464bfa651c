"""Which Citus worker holds each partition's bucket, for batches that commit on one worker.

With the tables distributed by bucket (:mod:`processor._postgres.schema.buckets`), a batch of
records from partitions whose buckets live on two workers commits in two phases over both. The
consumer's intake takes one worker's partitions per batch instead
(:class:`processor._runtime.consumer.intake.Intake`), asking this map. The batch store refreshes
it from Citus's catalog (:data:`REFRESH_S`), so a rebalance that moves a bucket is followed; until
then a batch may span two workers, which is slower, never wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import psycopg

from processor._engine.buckets import Buckets
from processor._ports import TP

__all__ = ["NODES", "REFRESH_S", "Colocation"]

REFRESH_S = 30.0
"""Seconds between reads of where the buckets live."""

NODES = """
SELECT s.shardminvalue::int, n.nodename || ':' || n.nodeport
  FROM pg_dist_shard AS s
  JOIN pg_dist_placement AS p ON p.shardid = s.shardid
  JOIN pg_dist_node AS n ON n.groupid = p.groupid
 WHERE s.logicalrelid = %s::regclass
"""
"""Each shard of the saga table, by its hash range's start, and the worker that holds it."""


class Colocation:
    """A partition's place: the worker of its bucket (the bucket itself until first read).

    Read on the consumer's thread, written by the batch store's (a dict replaced whole).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._layout: Buckets | None = None
        self._nodes: Mapping[int, str] = {}
        self._next = 0.0

    def __call__(self, tp: TP) -> object:
        layout = self._layout
        if layout is None:
            return None
        key = layout.of_partition(tp[1])
        return self._nodes.get(key, key)

    def of_bucket(self, key: int) -> object:
        """The worker of the bucket whose key is ``key`` (the key itself until first read)."""
        return self._nodes.get(key, key)

    def due(self) -> bool:
        """Whether the map should be read again now."""
        return self._clock() >= self._next

    def refresh(self, conn: psycopg.Connection[Any], layout: Buckets, table: str) -> None:
        """Reads where each bucket lives (``table``: the qualified saga table)."""
        rows = conn.execute(NODES, (table,)).fetchall()
        by_start = sorted(rows)
        nodes = {}
        if len(by_start) == layout.count:
            nodes = {layout.key(b): str(node) for b, (_, node) in enumerate(by_start)}
        self._layout = layout
        self._nodes = nodes
        self._next = self._clock() + REFRESH_S
