"""S9's batches (benchmarks/s9_layouts.py) and the bucket arithmetic the layout it chooses
rests on (docs/scaling.md): a saga's bucket is its key's partition at the count the tables were
made for, so after growth a partition's sagas fall in the buckets congruent to it modulo the
greatest common divisor of the two counts: one bucket when the new count is a multiple."""

from __future__ import annotations

import math

import pytest

from benchmarks.s9_layouts import BATCH, PARTITIONS, _batches, _Side
from processor._engine.partitioner import Partitioner, partition_for

EVENTS = 12 * BATCH * 3


@pytest.mark.parametrize("layout", ["partition-unnest", "grown12-unnest", "grown9-unnest"])
def test_every_batch_is_one_partitions_and_its_offsets_follow_on(layout: str) -> None:
    batches = _batches(EVENTS, "t", _Side(layout))
    count = 12 if "12" in layout else 9 if "9" in layout else PARTITIONS
    assert {b.partition for b in batches} == set(range(count))
    for p in range(count):
        starts = [b.start for b in batches if b.partition == p]
        assert starts == [BATCH * i for i in range(len(starts))]
        assert starts
    for batch in batches:
        modulus = math.gcd(count, PARTITIONS)
        assert all(b % modulus == batch.partition % modulus for b in batch.buckets)
        # The rows carry the bucket in the distribution column; the saga's id is its key.
        assert set(batch.saga[0::6]) == set(batch.buckets)
        if PARTITIONS % count == 0 or count % PARTITIONS == 0:
            assert batch.buckets == {batch.partition % PARTITIONS}


def test_a_topic_grown_to_a_count_that_is_no_multiple_spreads_some_batches() -> None:
    batches = _batches(EVENTS, "t", _Side("grown9-unnest"))
    assert any(len(b.buckets) > 1 for b in batches)


@pytest.mark.parametrize("partitioner", ["crc32", "murmur2"])
@pytest.mark.parametrize("grown", [12, 18, 9, 8, 7])
def test_a_partitions_sagas_after_growth_fall_in_the_buckets_congruent_to_it(
    partitioner: Partitioner, grown: int
) -> None:
    # The buckets a relay or a batch of partition p needs, computed from p alone, cover every
    # saga the producers' partitioner sends to p.
    modulus = math.gcd(grown, PARTITIONS)
    for n in range(3000):
        key = f"saga-{n}".encode()
        p = partition_for(key, grown, partitioner)
        bucket = partition_for(key, PARTITIONS, partitioner)
        assert bucket % modulus == p % modulus
        if grown % PARTITIONS == 0:
            assert bucket == p % PARTITIONS
