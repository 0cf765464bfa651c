"""An in-memory growth store: the PostgreSQL adapter's conditional writes over a given clock.

Tests share one instance between the growth watches of several replicas, as they would share a
database, and set its offsets as the replicas' commits would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime

from processor._engine.growth import Growth, GrowthState
from processor._ports import TP

__all__ = ["MemoryGrowthStore"]


class MemoryGrowthStore:
    """:class:`processor._ports.GrowthStore` in memory.

    Args:
        now: The store's clock (the database's, for the PostgreSQL adapter).

    Attributes:
        offsets: Committed next offsets by (group, topic, partition), as the offsets table
            holds them; tests set them as a worker's commits would.
    """

    def __init__(self, now: Callable[[], datetime]) -> None:
        self._now = now
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, str], int] = {}
        self.growths: dict[tuple[str, str, int], Growth] = {}
        self.offsets: dict[tuple[str, str, int], int | None] = {}

    def load(self, group_id: str) -> GrowthState:
        with self._lock:
            return GrowthState(
                now=self._now(),
                counts={t: c for (g, t), c in self.counts.items() if g == group_id},
                growths=tuple(v for (g, _, _), v in sorted(self.growths.items()) if g == group_id),
            )

    def baseline(self, group_id: str, topic: str, count: int) -> None:
        with self._lock:
            self.counts.setdefault((group_id, topic), count)

    def grow(self, group_id: str, topic: str, old_count: int, new_count: int) -> bool:
        with self._lock:
            if self.counts.get((group_id, topic)) != old_count:
                return False
            now = self._now()
            self.growths.setdefault(
                (group_id, topic, new_count),
                Growth(topic, old_count, new_count, now),
            )
            self.counts[(group_id, topic)] = new_count
            return True

    def committed(self, group_id: str, topics: Sequence[str]) -> dict[TP, int | None]:
        with self._lock:
            return {
                (t, p): n for (g, t, p), n in self.offsets.items() if g == group_id and t in topics
            }

    def close(self) -> None:
        """Nothing to release."""
