"""Checks that a rewound partition really resumes at the command it stopped on.

A participant that meets a transient failure seeks the partition back to the failed command and
tries again. A seek can fail without an error reaching the caller (librdkafka refuses seeks on a
partition that is not fetching yet, and records fetched before the seek can still be queued), and
a record past the rewind point would then be handled while the commands before it never are.
This guard makes that impossible: until the rewind point comes back, later records of that
partition are dropped and the seek is issued again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from processor._engine.records import Record

__all__ = ["RewindGuard"]

log = logging.getLogger(__name__)

TP = tuple[str, int]

GIVE_UP_AFTER = 20
"""Seeks tried before the rewind point is taken as gone (deleted by retention, say)."""


class RewindGuard:
    """Remembers where each rewound partition must resume, and enforces it.

    Args:
        seek: Seeks a partition to an offset (the consumer's seek).
    """

    def __init__(self, seek: Callable[[TP, int], None]) -> None:
        self._seek = seek
        self._want: dict[TP, int] = {}
        self._tries: dict[TP, int] = {}

    @property
    def pending(self) -> dict[TP, int]:
        """Partitions still waiting for their rewind point, with that offset."""
        return dict(self._want)

    def rewind(self, firsts: dict[TP, int]) -> None:
        """Seeks each partition to its first unhandled offset and remembers it."""
        for tp, offset in firsts.items():
            self._want[tp] = offset
            self._tries[tp] = 0
            self._seek(tp, offset)

    def forget(self, tps: Iterable[TP]) -> None:
        """Drops partitions whose position now comes from the database (assigned or revoked)."""
        for tp in tps:
            self._want.pop(tp, None)
            self._tries.pop(tp, None)

    def admit(self, records: Sequence[Record]) -> list[Record]:
        """Returns the records that may be handled; seeks again where a rewind did not take."""
        if not self._want:
            return list(records)
        out: list[Record] = []
        missed: dict[TP, int] = {}
        for r in records:
            tp = (r.topic, r.partition)
            want = self._want.get(tp)
            if want is None or r.offset < want:
                out.append(r)  # not rewound, or already handled: the inbox drops a repeat
            elif r.offset == want:
                self.forget([tp])
                out.append(r)
            else:
                missed.setdefault(tp, r.offset)
        for tp, seen in missed.items():
            want = self._want[tp]
            self._tries[tp] += 1
            if self._tries[tp] > GIVE_UP_AFTER:
                # The partition no longer starts at or before the rewind point.
                log.error(
                    "%s:%d: offset %d did not come back after %d seeks; going on from %d",
                    tp[0],
                    tp[1],
                    want,
                    GIVE_UP_AFTER,
                    seen,
                )
                self.forget([tp])
                self._seek(tp, seen)  # the records dropped this round come again
                continue
            log.warning(
                "%s:%d: rewind to %d did not take (got %d); seeking again", tp[0], tp[1], want, seen
            )
            self._seek(tp, want)
        return out
