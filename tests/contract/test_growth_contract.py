"""One suite for every GrowthStore: the in-memory one and PostgreSQL.

Replicas that notice the same growth write to the same store, so every write is conditional;
the cases run two stores over one database (or one memory store) to show it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Protocol

import pytest

from processor.memory.growth import MemoryGrowthStore
from processor.ports import GrowthStore
from processor.postgres.connect import connect, ensure_schema
from processor.postgres.growth import PostgresGrowthStore
from processor.postgres.schema import Tables
from tests.contract import BACKENDS, postgres_args

HOUR = timedelta(hours=1)


class Backend(Protocol):
    def replica(self) -> GrowthStore:
        """A store as another replica sees it (the same tables)."""
        ...

    def commit(self, group_id: str, topic: str, partition: int, next_offset: int) -> None:
        """Stores a committed offset, as a worker's batch would."""
        ...

    def close(self) -> None: ...


class MemoryBackend:
    def __init__(self) -> None:
        self.memory = MemoryGrowthStore(lambda: datetime.now(UTC))

    def replica(self) -> GrowthStore:
        return self.memory

    def commit(self, group_id: str, topic: str, partition: int, next_offset: int) -> None:
        self.memory.offsets[(group_id, topic, partition)] = next_offset

    def close(self) -> None:
        pass


class PostgresBackend:
    def __init__(self, url: str, schema: str) -> None:
        self.url = url
        self.tables = Tables(schema)
        ensure_schema(url, self.tables)
        self.made: list[PostgresGrowthStore] = []

    def replica(self) -> GrowthStore:
        store = PostgresGrowthStore(lambda: connect(self.url), self.tables)
        self.made.append(store)
        return store

    def commit(self, group_id: str, topic: str, partition: int, next_offset: int) -> None:
        with connect(self.url) as conn:
            conn.execute(
                self.tables.render(
                    "INSERT INTO {offsets} (group_id, topic, partition, next_offset, owner_epoch)"
                    " VALUES (%s, %s, %s, %s, 1)"
                ),
                (group_id, topic, partition, next_offset),
            )

    def close(self) -> None:
        for store in self.made:
            store.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    args = postgres_args(request)
    made: Backend = MemoryBackend() if args is None else PostgresBackend(*args)
    yield made
    made.close()


def test_the_first_baseline_stands(backend: Backend) -> None:
    a, b = backend.replica(), backend.replica()
    a.baseline("g", "in", 6)
    b.baseline("g", "in", 8)
    assert b.load("g").counts == {"in": 6}
    assert a.load("other").counts == {}


def test_a_growth_is_recorded_once_with_its_barrier_after_the_grace(backend: Backend) -> None:
    a, b = backend.replica(), backend.replica()
    a.baseline("g", "in", 6)
    assert a.grow("g", "in", 6, 12, HOUR)
    # The second replica saw the same change: the known count is no longer its old count.
    assert not b.grow("g", "in", 6, 12, HOUR)
    state = b.load("g")
    assert state.counts == {"in": 12}
    [g] = state.growths
    assert (g.topic, g.old_count, g.new_count, g.watermarks, g.passed_at) == (
        "in",
        6,
        12,
        None,
        None,
    )
    assert g.barrier_at - g.noticed_at == HOUR
    assert abs(state.now - g.noticed_at) < timedelta(minutes=1)


def test_watermarks_wait_for_the_barrier_and_the_first_writer_wins(backend: Backend) -> None:
    a, b = backend.replica(), backend.replica()
    a.baseline("g", "in", 6)
    a.baseline("g", "late", 2)
    assert a.grow("g", "late", 2, 4, HOUR)
    assert not a.store_watermarks("g", "late", 4, {0: 1, 1: 1})
    assert a.grow("g", "in", 6, 12, timedelta(0))
    assert a.store_watermarks("g", "in", 12, {p: 10 + p for p in range(6)})
    assert not b.store_watermarks("g", "in", 12, {p: 99 for p in range(6)})
    growths = {g.topic: g for g in b.load("g").growths}
    assert growths["in"].watermarks == {p: 10 + p for p in range(6)}
    assert growths["late"].watermarks is None


def test_passed_is_marked_once(backend: Backend) -> None:
    a, b = backend.replica(), backend.replica()
    a.baseline("g", "in", 6)
    assert a.grow("g", "in", 6, 12, timedelta(0))
    a.mark_passed("g", "in", 12)
    [first] = b.load("g").growths
    assert first.passed_at is not None
    b.mark_passed("g", "in", 12)
    [again] = a.load("g").growths
    assert again.passed_at == first.passed_at


def test_committed_offsets_are_the_groups_own(backend: Backend) -> None:
    store = backend.replica()
    backend.commit("g", "in", 0, 40)
    backend.commit("g", "in", 1, 41)
    backend.commit("g", "elsewhere", 0, 7)
    backend.commit("h", "in", 0, 99)
    assert store.committed("g", ["in"]) == {("in", 0): 40, ("in", 1): 41}
    assert store.committed("h", ["in", "elsewhere"]) == {("in", 0): 99}
