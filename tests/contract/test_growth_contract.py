"""One suite for every GrowthStore: the in-memory one and PostgreSQL.

Replicas that notice the same growth write to the same store, so every write is conditional;
the cases run two stores over one database (or one memory store) to show it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Protocol

import pytest

from processor._memory.growth import MemoryGrowthStore
from processor._ports import GrowthStore
from processor._postgres.connect import connect, ensure_schema
from processor._postgres.growth import PostgresGrowthStore
from processor._postgres.schema.tables import Tables
from tests.contract import BACKENDS, postgres_args


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


def test_a_growth_is_recorded_once(backend: Backend) -> None:
    a, b = backend.replica(), backend.replica()
    a.baseline("g", "in", 6)
    assert a.grow("g", "in", 6, 12)
    # The second replica saw the same change: the known count is no longer its old count.
    assert not b.grow("g", "in", 6, 12)
    state = b.load("g")
    assert state.counts == {"in": 12}
    [g] = state.growths
    assert (g.topic, g.old_count, g.new_count) == ("in", 6, 12)
    assert abs(state.now - g.noticed_at) < timedelta(minutes=1)
    # Growing again keeps both, oldest first.
    assert b.grow("g", "in", 12, 24)
    assert [(g.old_count, g.new_count) for g in a.load("g").growths] == [(6, 12), (12, 24)]


def test_committed_offsets_are_the_groups_own(backend: Backend) -> None:
    store = backend.replica()
    backend.commit("g", "in", 0, 40)
    backend.commit("g", "in", 1, 41)
    backend.commit("g", "elsewhere", 0, 7)
    backend.commit("h", "in", 0, 99)
    assert store.committed("g", ["in"]) == {("in", 0): 40, ("in", 1): 41}
    assert store.committed("h", ["in", "elsewhere"]) == {("in", 0): 99}
