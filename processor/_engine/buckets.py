"""Buckets: where a saga's rows live when the processor's tables are distributed by bucket.

On Citus with ``SAGA_DATABASE__DISTRIBUTED=buckets`` every saga table is distributed by a
``bucket`` column (docs/scaling.md, "Distributed by bucket"). A saga's bucket is the partition
its key would have among ``buckets`` partitions, the input topics' partition count when the
tables were distributed (recorded once), under the producers' partitioner. It never changes, so
no row moves when a topic grows.

A partition ``p`` of a topic with ``count`` partitions holds the keys whose hash is ``p`` modulo
``count``; their buckets are the ``b`` with ``b == p`` modulo ``gcd(count, buckets)``. When
``count`` is a multiple of ``buckets`` that is the one bucket ``p % buckets``, so a partition's
batch is one bucket's: a transaction on one worker. Otherwise it spans a few buckets (a
transaction committed in two phases over their workers: correct, slower).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import gcd

from processor._engine.partitioner import Partitioner, partition_for

__all__ = ["Buckets", "growth_verdict"]

# Saga buckets kept by a layout: a few batches' worth of sagas, cleared whole when full.
_KNOWN = 1 << 16


@dataclass(frozen=True)
class Buckets:
    """The recorded bucket count, the partitioner that keys sagas, and each bucket's key.

    ``keys[b]`` is the value rows of bucket ``b`` carry in their ``bucket`` column: a value that
    Citus's hash puts in the ``b``-th of the tables' shards (in hash order), chosen when the
    tables were distributed, so that each bucket is a shard of its own and the shards, placed
    round robin, spread the buckets evenly over the workers. Without ``keys`` it is ``b``.
    """

    count: int
    partitioner: Partitioner = "crc32"
    keys: tuple[int, ...] = ()
    # Each saga's bucket value, as computed: a batch asks for it once per row it writes (four
    # rows an event in S8), from several threads (a dict's get and set are atomic).
    _known: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"the bucket count is at least 1, not {self.count}")
        if self.keys and len(self.keys) != self.count:
            raise ValueError(f"{len(self.keys)} bucket keys for {self.count} buckets")

    def key(self, bucket: int) -> int:
        """The ``bucket`` column's value for rows of ``bucket``."""
        return self.keys[bucket] if self.keys else bucket

    def of(self, saga_id: str) -> int:
        """The ``bucket`` value of the saga keyed by ``saga_id`` (its records' key is the id)."""
        known = self._known
        bucket = known.get(saga_id)
        if bucket is None:
            bucket = self.of_key(saga_id.encode())
            if len(known) >= _KNOWN:
                known.clear()
            known[saga_id] = bucket
        return bucket

    def of_key(self, key: bytes) -> int:
        """The ``bucket`` value of rows of the records keyed by ``key`` (a participant's)."""
        return self.key(partition_for(key, self.count, self.partitioner))

    def of_partition(self, partition: int) -> int:
        """The ``bucket`` value of a partition's own rows (its offsets, its dead letters)."""
        return self.key(partition % self.count)

    def of_row(self, saga_id: str | None, source: tuple[str, int] | None) -> int:
        """The ``bucket`` value of an outbox row: its saga's, else its source partition's."""
        if saga_id is not None:
            return self.of(saga_id)
        return self.of_partition(source[1] if source is not None else 0)

    def of_partition_sagas(self, partition: int, partitions: int) -> tuple[int, ...]:
        """The ``bucket`` values a saga read from ``partition`` of ``partitions`` can have."""
        step = gcd(partitions, self.count)
        return tuple(self.key(b) for b in range(partition % step, self.count, step))


def growth_verdict(partitions: int, buckets: int) -> str:
    """What a topic of ``partitions`` partitions means for tables made for ``buckets``."""
    if partitions % buckets == 0:
        return (
            f"{partitions} partitions, a multiple of the {buckets} buckets: every partition's "
            "sagas are in one bucket, a batch is one worker's transaction"
        )
    spread = buckets // gcd(partitions, buckets)
    return (
        f"{partitions} partitions, not a multiple of the {buckets} buckets: a partition's sagas "
        f"fall in {spread} buckets, so a batch may commit in two phases over several workers "
        f"(correct, slower); grow to a multiple of {buckets} to keep batches local"
    )
