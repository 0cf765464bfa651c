"""Buckets: a saga's bucket never changes, and which buckets a partition's sagas are in."""

from __future__ import annotations

import zlib

import pytest

from processor._engine.buckets import Buckets, growth_verdict
from processor._engine.partitioner import partition_for
from processor._postgres.batch import sql_buckets


def test_a_sagas_bucket_is_its_partition_among_the_recorded_count() -> None:
    buckets = Buckets(6)
    for i in range(200):
        saga = f"s-{i}"
        assert buckets.of(saga) == zlib.crc32(saga.encode()) % 6
    murmur = Buckets(6, "murmur2")
    assert murmur.of("s-1") == partition_for(b"s-1", 6, "murmur2")


def test_keys_stand_for_bucket_numbers() -> None:
    buckets = Buckets(3, keys=(7, 1, 4))
    assert [buckets.key(b) for b in range(3)] == [7, 1, 4]
    assert buckets.of_partition(5) == 4
    assert buckets.of_row(None, ("in", 4)) == 1
    assert buckets.of_row(None, None) == 7
    with pytest.raises(ValueError, match="2 bucket keys for 3 buckets"):
        Buckets(3, keys=(1, 2))
    with pytest.raises(ValueError, match="at least 1"):
        Buckets(0)


@pytest.mark.parametrize("grown", [6, 12, 18, 9, 8, 4])
def test_every_saga_read_from_a_partition_is_in_one_of_its_buckets(grown: int) -> None:
    buckets = Buckets(6)
    for i in range(2000):
        saga = f"saga-{i}"
        partition = zlib.crc32(saga.encode()) % grown
        assert buckets.of(saga) in buckets.of_partition_sagas(partition, grown)


def test_growth_to_a_multiple_keeps_one_bucket_per_partition() -> None:
    buckets = Buckets(6)
    assert all(len(buckets.of_partition_sagas(p, 12)) == 1 for p in range(12))
    assert {len(buckets.of_partition_sagas(p, 9)) for p in range(9)} == {2}
    assert "a multiple" in growth_verdict(12, 6)
    assert "not a multiple" in growth_verdict(9, 6)
    assert "2 buckets" in growth_verdict(9, 6)


def test_every_bucket_statement_names_the_bucket_as_an_int() -> None:
    texts = {k: v for k, v in vars(sql_buckets).items() if k.isupper() and isinstance(v, str)}
    assert texts
    for name, text in texts.items():
        assert "bucket" in text, name
