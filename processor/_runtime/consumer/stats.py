"""The consumer loop's counters, read by the metrics thread while the loop changes them."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class WorkerStats:
    batches: int = 0
    records: int = 0
    rejected_batches: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    # Sagas ended, by (saga type, outcome).
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    # Sagas handed to a person, by (saga type, kind: handler, step or undo).
    escalations: Counter[tuple[str, str]] = field(default_factory=Counter)
    # Replies addressed to saga types this processor does not run, by (topic, saga type).
    foreign: Counter[tuple[str, str]] = field(default_factory=Counter)
    # Times the positions were read back from the store (fenced, failed or in-doubt commit).
    resyncs: int = 0
    # Batches in doubt whose partitions changed owner before their outcome could be read.
    doubts_unresolved: int = 0
    # time.monotonic() at the start of the last poll: the liveness probe's heartbeat.
    last_step: float = field(default_factory=time.monotonic)
    # Seconds the last batch's write and commit took (set on the write lane, read after it).
    last_commit_seconds: float = 0.0
    # Assigned partitions waiting, unclaimed, for their topic's new count (_runtime/growth.py),
    # plus new partitions whose records have waited FOLLOW_SLOW for the ones they follow.
    growth_waiting: int = 0
    # Owned partitions set aside because the node their rows live on (a Citus worker, with
    # tables distributed by bucket) stopped answering while the others' go on.
    partitions_away: int = 0
    # Assigned partitions not claimed because that node failed their claim while others answered.
    claims_on_node: int = 0

    @property
    def waiting_on_node(self) -> int:
        """Partitions waiting for the one node their rows live on: set aside or unclaimed."""
        return self.partitions_away + self.claims_on_node
