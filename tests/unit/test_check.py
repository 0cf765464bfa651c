"""The preflight check's judgement over a fake database and cluster (the real one is in
tests/integration/test_upcasting.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pytest

from processor._authoring.messages import registry
from processor._errors import SchemaNotMigrated
from processor._invocation import bind_all
from processor._ports.operator import StoredSaga
from processor._postgres.schema.tables import MIGRATIONS, Tables, pending_sql
from processor.ops._check import Topology, run_check
from tests.unit.test_upcasting import AccountV2


@dataclass
class FakeSource:
    schema: int = len(MIGRATIONS)
    sagas: list[StoredSaga] = field(default_factory=list)
    deadlines: list[tuple[str, str, int]] = field(default_factory=list)
    parked: list[tuple[str, str | None, str | None, int]] = field(default_factory=list)
    partitions: dict[str, set[int]] = field(default_factory=dict)
    where: str | None = None
    wrong_node: str | None = None
    bucket_count: int | None = None

    def schema_version(self) -> int:
        return self.schema

    def unended_sagas(self) -> Iterable[StoredSaga]:
        return self.sagas

    def pending_deadlines(self) -> list[tuple[str, str, int]]:
        return self.deadlines

    def parked_messages(self) -> list[tuple[str, str | None, str | None, int]]:
        return self.parked

    def stored_partitions(self, group_id: str) -> dict[str, set[int]]:
        return self.partitions

    def distribution(self) -> str | None:
        return self.where

    def buckets(self) -> int | None:
        return self.bucket_count

    def node_problem(self) -> str | None:
        return self.wrong_node


SAGAS = bind_all([AccountV2])
TYPE = "unit-upcast-account"


def _row(i: int, state: dict[str, object], version: int) -> StoredSaga:
    return StoredSaga(TYPE, f"a-{i}", state, version, "active", None, None)


def test_a_healthy_database_passes_with_notes_on_rows_to_upcast() -> None:
    rows = [_row(1, {"account": "a-1", "balance": "1", "legacy_flag": True}, 1)]
    report = run_check(FakeSource(sagas=rows), SAGAS, registry, expected_schema=len(MIGRATIONS))
    assert report.ok, report.render()
    assert report.notes == [
        f"saga {TYPE!r}: 1 saga(s) stored at state v1 are upcast to v2 on their next change"
    ]
    assert report.render().endswith("check passed")


def test_every_kind_of_problem_is_reported_at_once() -> None:
    rows = [_row(i, {"x": 1}, 0) for i in range(5)] + [
        StoredSaga("gone-saga", "g", {}, 1, "parked", None, None)
    ]
    source = FakeSource(
        schema=len(MIGRATIONS) - 1,
        sagas=rows,
        deadlines=[(TYPE, "no-such-timer", 2)],
        parked=[(TYPE, "unit.upcast.Unknown", "1", 1)],
        partitions={"in": {0, 1}},
    )

    def counts(topics: Iterable[str]) -> Mapping[str, int | None]:
        return {"in": 3, "out": None}

    topology = Topology("g", frozenset({"in"}), frozenset({"out"}), counts)
    report = run_check(source, SAGAS, registry, expected_schema=len(MIGRATIONS), topology=topology)
    text = "\n".join(report.problems)
    assert f"schema is at migration {len(MIGRATIONS) - 1}" in text
    assert f"saga {TYPE!r} state v0: 5 unended saga(s) cannot run" in text
    assert "e.g. a-0, a-1, a-2)" in text  # examples, not every id
    assert "'gone-saga'" in text
    assert "pending deadline(s) 'no-such-timer'" in text
    assert "'unit.upcast.Unknown' v1 that this code cannot decode" in text
    assert "topic 'out' (the processor writes it) does not exist" in text
    assert "topic 'in' has 3 partition(s)" in text
    assert len(report.problems) == 7
    assert report.render().endswith("check FAILED: 7 problem(s)")


def test_pending_sql_lists_only_the_migrations_not_yet_applied() -> None:
    tables = Tables("s")
    assert pending_sql(len(MIGRATIONS), tables) == ""
    last = pending_sql(len(MIGRATIONS) - 1, tables)
    assert f"-- migration {len(MIGRATIONS)}" in last
    assert 'CREATE TABLE "s"."saga_instance"' not in last
    assert f"VALUES ({len(MIGRATIONS)});" in last
    assert pending_sql(0, tables).startswith('CREATE SCHEMA IF NOT EXISTS "s";')
    assert "citus_schema_distribute" not in pending_sql(0, tables)


def test_pending_sql_distributes_a_new_schema_before_its_tables_and_an_old_one_first() -> None:
    tables = Tables("s")
    new = pending_sql(0, tables, distribute=True)
    create, distribute = (
        new.index('CREATE SCHEMA IF NOT EXISTS "s"'),
        new.index("SELECT citus_schema_distribute('\"s\"'::regnamespace);"),
    )
    assert create < distribute < new.index("schema_version")
    # A schema at the last migration that is moved to a worker: the move is all there is.
    moved = pending_sql(len(MIGRATIONS), tables, distribute=True)
    assert moved.strip().endswith("SELECT citus_schema_distribute('\"s\"'::regnamespace);")
    assert "CREATE" not in moved


def test_a_url_to_another_citus_node_than_the_schemas_processes_use_fails_the_check() -> None:
    wrong = "the database URL reaches Citus node c:5432, but ... connect through w1:5432"
    report = run_check(
        FakeSource(wrong_node=wrong), SAGAS, registry, expected_schema=len(MIGRATIONS)
    )
    assert not report.ok
    assert wrong in report.problems


def test_check_notes_where_a_citus_schema_lives() -> None:
    where = "schema 's' is a Citus 13.2-1 distributed schema on w1:5432"
    report = run_check(FakeSource(where=where), SAGAS, registry, expected_schema=len(MIGRATIONS))
    assert report.ok
    assert f"note: {where}" in report.render()


def test_a_topic_grown_to_a_multiple_is_a_note_and_any_other_count_a_problem() -> None:
    def check(stored: set[int], count: int) -> tuple[list[str], list[str]]:
        topology = Topology("g", frozenset({"in"}), frozenset(), lambda _: {"in": count})
        report = run_check(
            FakeSource(partitions={"in": stored}),
            SAGAS,
            registry,
            expected_schema=len(MIGRATIONS),
            topology=topology,
        )
        return report.problems, report.notes

    problems, notes = check(set(range(6)), 12)
    assert problems == []
    assert notes == [
        "topic 'in' grew from 6 to 12 partitions; the replicas take the new ones, each record "
        "after what was sent to the old ones first"
    ]
    problems, _ = check(set(range(6)), 8)
    assert len(problems) == 1
    assert "topic 'in' has 8 partition(s)" in problems[0]
    assert check(set(range(12)), 12) == ([], [])


def test_record_keys_off_the_configured_partitioner_are_a_problem_naming_the_one_that_fits() -> (
    None
):
    from processor._engine.partitioner import Partitioner, partition_for

    keys = [f"tr-{i}".encode() for i in range(40)]

    def check(placed_by: Partitioner, configured: Partitioner) -> list[str]:
        sample = [(k, partition_for(k, 6, placed_by)) for k in keys]
        topology = Topology(
            "g",
            frozenset({"in"}),
            frozenset(),
            lambda _: {"in": 6},
            sample_keys=lambda topic, count: sample,
            partitioner=configured,
        )
        report = run_check(
            FakeSource(partitions={"in": set(range(6))}),
            SAGAS,
            registry,
            expected_schema=len(MIGRATIONS),
            topology=topology,
        )
        assert report.counts["sampled keys"] == len(keys)
        return report.problems

    assert check("crc32", "crc32") == []
    assert check("murmur2", "murmur2") == []
    [problem] = check("murmur2", "crc32")
    assert "sampled record keys are not on the partition SAGA_CONSUMER__PARTITIONER=crc32" in (
        problem
    )
    assert "every sampled key fits murmur2: set SAGA_CONSUMER__PARTITIONER=murmur2" in problem


def test_a_schema_newer_than_the_code_is_a_warning_so_a_rollback_passes() -> None:
    report = run_check(
        FakeSource(schema=len(MIGRATIONS) + 1), SAGAS, registry, expected_schema=len(MIGRATIONS)
    )
    assert report.ok
    assert report.schema_newer
    assert any(n.startswith("WARNING: schema is at migration") for n in report.notes)
    older = run_check(
        FakeSource(schema=len(MIGRATIONS) - 1), SAGAS, registry, expected_schema=len(MIGRATIONS)
    )
    assert not older.ok
    assert not older.schema_newer


def test_a_schema_never_migrated_stops_the_check_before_any_table_is_read() -> None:
    class Unmigrated(FakeSource):
        def unended_sagas(self) -> Iterable[StoredSaga]:
            raise AssertionError("the check read a table of a schema it found not migrated")

    with pytest.raises(SchemaNotMigrated, match=f"this code expects {len(MIGRATIONS)}"):
        run_check(Unmigrated(schema=0), SAGAS, registry, expected_schema=len(MIGRATIONS))


def test_on_buckets_each_input_topic_is_said_to_keep_batches_local_or_not() -> None:
    counts = {"in": 12, "also": 9}
    topology = Topology("g", frozenset(counts), frozenset(), lambda topics: counts)
    report = run_check(
        FakeSource(bucket_count=6),
        SAGAS,
        registry,
        expected_schema=len(MIGRATIONS),
        topology=topology,
    )
    notes = "\n".join(report.notes)
    assert "topic 'in': 12 partitions, a multiple of the 6 buckets" in notes
    assert "topic 'also': 9 partitions, not a multiple of the 6 buckets" in notes
    assert "grow to a multiple of 6" in notes
    assert report.ok
