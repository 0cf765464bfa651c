"""The producers' partitioners, reproduced: Kafka's murmur2 and librdkafka's crc32."""

from __future__ import annotations

import zlib

import pytest

from processor._engine.partitioner import murmur2, partition_for

# Kafka's own test vectors (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java).
KAFKA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS)
def test_murmur2_matches_the_java_client(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_murmur2_partition_clears_the_sign_bit_rather_than_negating() -> None:
    # toPositive(-973932308) = -973932308 & 0x7fffffff = 1173551340.
    assert partition_for(b"21", 1_000_000_007, "murmur2") == 1173551340 % 1_000_000_007
    assert partition_for(b"21", 12, "murmur2") == 1173551340 % 12


def test_crc32_is_zlib_crc32_modulo_the_count() -> None:
    for key in (b"tr-1", b"order-42", b"x" * 100):
        assert partition_for(key, 7, "crc32") == zlib.crc32(key) % 7


@pytest.mark.parametrize("partitioner", ["murmur2", "crc32"])
def test_growth_to_a_multiple_moves_keys_only_to_new_partitions_of_their_old_one(
    partitioner: str,
) -> None:
    moved = 0
    for i in range(2000):
        key = f"saga-{i}".encode()
        old = partition_for(key, 6, partitioner)  # type: ignore[arg-type]
        new = partition_for(key, 12, partitioner)  # type: ignore[arg-type]
        if new != old:
            moved += 1
            assert new >= 6
        assert new % 6 == old
    assert 800 < moved < 1200  # about half the keys move


def test_a_topic_has_at_least_one_partition() -> None:
    with pytest.raises(ValueError, match="at least one partition"):
        partition_for(b"k", 0, "murmur2")
