"""The partition a key goes to, computed as the producers' default partitioners compute it.

Producers key every record of a saga by its id and let their client's default partitioner pick
the partition; the processor must agree with them when it routes records itself (deadline-fired
records of sagas that moved when their topic grew). Two partitioners cover the usual clients:

- ``murmur2``: the Java clients' ``DefaultPartitioner`` for keyed records (and librdkafka's
  ``murmur2``/``murmur2_random``): ``toPositive(murmur2(key)) % n``.
- ``crc32``: librdkafka's ``consistent``/``consistent_random`` (its default, so the Python, Go
  and .NET clients'): ``crc32(key) % n``.

Both are a hash modulo the count, so when a topic grows from M to a multiple N of M, a key whose
partition changes goes from ``p`` to a brand-new ``q`` with ``q % M == p``.
"""

from __future__ import annotations

import zlib
from typing import Literal

__all__ = [
    "LIBRDKAFKA_NAMES",
    "Partitioner",
    "fits",
    "matching",
    "murmur2",
    "normalise",
    "partition_for",
]

Partitioner = Literal["murmur2", "crc32"]

LIBRDKAFKA_NAMES: dict[Partitioner, str] = {
    "murmur2": "murmur2_random",
    "crc32": "consistent_random",
}
"""The librdkafka ``partitioner`` value that computes each: what this project's producers set."""

_ALIASES: dict[str, Partitioner] = {
    "murmur2": "murmur2",
    "murmur2_random": "murmur2",
    "java": "murmur2",
    "crc32": "crc32",
    "consistent": "crc32",
    "consistent_random": "crc32",
}


def normalise(name: str) -> Partitioner:
    """The partitioner a setting names: ours, or librdkafka's name for it.

    Raises:
        ValueError: A name that is neither (e.g. librdkafka's ``random`` or ``fnv1a``: keys
            would not decide the partition, or not in a way any Java client agrees with).
    """
    found = _ALIASES.get(name.strip().lower())
    if found is None:
        raise ValueError(
            f"unknown partitioner {name!r}: use crc32 (librdkafka's default consistent_random: "
            "Python, Go, .NET and C producers) or murmur2 (Java producers, librdkafka's "
            "murmur2_random)"
        )
    return found


_MASK = 0xFFFFFFFF
_M = 0x5BD1E995
_SEED = 0x9747B28C


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 of ``data``, as the Java client's ``Utils.murmur2`` (signed int)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, count: int, partitioner: Partitioner) -> int:
    """The partition of ``count`` that the producers' ``partitioner`` sends ``key`` to.

    Raises:
        ValueError: ``count`` is not positive.
    """
    if count < 1:
        raise ValueError(f"a topic has at least one partition, not {count}")
    if partitioner == "murmur2":
        # Java's toPositive: the sign bit cleared, not the absolute value.
        return (murmur2(key) & 0x7FFFFFFF) % count
    return zlib.crc32(key) % count


def fits(key: bytes, partition: int, counts: tuple[int, ...], partitioner: Partitioner) -> bool:
    """Whether ``partitioner`` sends ``key`` to ``partition`` at any of the partition ``counts``.

    A topic that grew has more than one count in play: producers that have not refreshed their
    metadata still hash with the old one.
    """
    return any(partition_for(key, n, partitioner) == partition for n in counts if n > partition)


def matching(keyed: list[tuple[bytes, int]], counts: tuple[int, ...]) -> list[Partitioner]:
    """The partitioners that put every sampled ``(key, partition)`` where it is."""
    names: tuple[Partitioner, ...] = ("crc32", "murmur2")
    return [name for name in names if all(fits(k, p, counts, name) for k, p in keyed)]
