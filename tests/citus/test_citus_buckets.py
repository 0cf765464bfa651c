"""The processor's tables distributed by bucket (``SAGA_DATABASE__DISTRIBUTED=buckets``).

Each bucket is a shard group of its own, the groups spread over both workers; a partition's
batch, its relay claim and its load run on the worker of the partition's bucket alone (read from
the commands Citus logs), and each hot statement that names a bucket gets a router plan (one
task).
"""

from __future__ import annotations

import functools
import uuid
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.numeric import Int4

from processor._engine.buckets import Buckets
from processor._engine.records import OffsetCommit, OutboxRow
from processor._engine.rows import HistoryRow, Outcome, SagaStatus, SagaWrite, Wants, WriteSet
from processor._errors import ConfigurationError
from processor._postgres.batch import sql_buckets
from processor._postgres.batch.handle import PostgresBatchStore
from processor._postgres.connect import connect
from processor._postgres.outbox import PostgresOutboxStore
from processor._postgres.reads.check import PostgresCheckSource
from processor._postgres.schema.buckets import BY_BUCKET, ON_COORDINATOR, REFERENCE, read_layout
from processor._postgres.schema.citus import distributed, pinned_node
from processor._postgres.schema.citus_move import MoveRefused, move_pin
from processor._postgres.schema.tables import MIGRATIONS, Tables, migrate

pytestmark = pytest.mark.integration

SAGA = "bucket-saga"
BUCKETS = 6


@pytest.fixture
def schema(citus_url: str) -> Iterator[str]:
    name = f"t_bucket_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(citus_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def layout(citus_url: str, schema: str) -> Buckets:
    with psycopg.connect(citus_url) as conn:
        assert migrate(conn, Tables(schema), "buckets", buckets=BUCKETS) == len(MIGRATIONS)
        conn.commit()
        found = read_layout(conn, schema)
    assert found is not None
    return found


def ids_in(partition: int, n: int) -> list[str]:
    """Saga ids that librdkafka's default partitioner sends to ``partition`` of 6."""
    found = (f"saga-{i}" for i in range(100_000))
    return [s for s in found if zlib.crc32(s.encode()) % BUCKETS == partition][:n]


def workers_of(conn: psycopg.Connection[Any], schema: str) -> dict[int, str]:
    """Each bucket key's worker, "host:port", from the shards of the saga table."""
    rows = conn.execute(
        """
        SELECT s.shardminvalue::int, p.nodename || ':' || p.nodeport
          FROM pg_dist_shard AS s JOIN citus_shards AS p ON p.shardid = s.shardid
         WHERE s.logicalrelid = %s::regclass
        """,
        (f"{schema}.saga_instance",),
    ).fetchall()
    layout = read_layout(conn, schema)
    assert layout is not None
    by_min = dict(rows)
    keys = layout.keys
    return {keys[b]: by_min[sorted(by_min)[b]] for b in range(layout.count)}


def start_sagas(store: PostgresBatchStore, partition: int, sagas: list[str]) -> None:
    """One batch of ``partition`` starting ``sagas``: their rows, history and a command each."""
    store.write(
        WriteSet(
            sagas=[SagaWrite(SAGA, s, {"n": 1}, SagaStatus.ACTIVE, 1, None, None) for s in sagas],
            history=[
                HistoryRow(
                    SAGA, s, f"m-{s}", "Started", "event", Outcome.APPLIED, 1, "in", partition, n
                )
                for n, s in enumerate(sagas)
            ],
            outbox=[
                OutboxRow(SAGA, s, "out", s.encode(), {}, b"v", None, ("in", partition))
                for s in sagas
            ],
        ),
        [OffsetCommit("in", partition, len(sagas), None, 1)],
    )


class Remote:
    """The commands Citus sends to the workers over one store's connection, and where."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, str]] = []

    def connect(self, url: str) -> psycopg.Connection[Any]:
        conn = connect(url)
        conn.execute("SET citus.log_remote_commands = on")
        conn.execute("SET client_min_messages = log")
        conn.commit()
        conn.add_notice_handler(
            lambda d: self.commands.append((d.message_primary or "", d.message_detail or ""))
        )
        return conn

    def nodes(self) -> set[str]:
        return {d.split("@", 1)[1].split(" ", 1)[0] for _, d in self.commands if "@" in d}


def test_every_saga_table_is_distributed_by_bucket_a_shard_each_spread_over_the_workers(
    citus_url: str, schema: str, layout: Buckets
) -> None:
    with psycopg.connect(citus_url, autocommit=True) as conn:
        kinds: dict[str, str] = dict(
            conn.execute(
                "SELECT table_name::text, citus_table_type FROM citus_tables"
                " WHERE table_name::text LIKE %s",
                (f"{schema}.%",),
            ).fetchall()
        )
        groups = conn.execute(
            "SELECT count(DISTINCT colocation_id), min(shard_count), max(shard_count)"
            " FROM citus_tables"
            " WHERE table_name::text LIKE %s AND citus_table_type = 'distributed'",
            (f"{schema}.%",),
        ).fetchone()
        keys = conn.execute(
            "SELECT kcu.table_name, string_agg(kcu.column_name, ',' ORDER BY kcu.ordinal_position)"
            " FROM information_schema.table_constraints AS tc"
            " JOIN information_schema.key_column_usage AS kcu USING (constraint_name, table_schema)"
            " WHERE tc.table_schema = %s AND tc.constraint_type IN ('PRIMARY KEY', 'UNIQUE')"
            " GROUP BY kcu.table_name, tc.constraint_name",
            (schema,),
        ).fetchall()
        workers = workers_of(conn, schema)
    distributed = {name.replace("{deadline}", "saga_deadline") for name in BY_BUCKET}
    references = {name.replace("{deadline_lock}", "saga_deadline_lock") for name in REFERENCE}
    assert {f"{schema}.{t}" for t in distributed} == {
        t for t, kind in kinds.items() if kind == "distributed"
    }
    assert {f"{schema}.{t}" for t in references} == {
        t for t, kind in kinds.items() if kind == "reference"
    }
    # The lease stays a plain table on the coordinator, outside Citus's metadata.
    local = {name.replace("{deadline_lock}", "saga_deadline_lock") for name in ON_COORDINATOR}
    assert local
    assert not {f"{schema}.{t}" for t in local} & set(kinds)
    assert groups == (1, BUCKETS, BUCKETS)
    for table, columns in keys:
        if table in distributed:
            assert columns.split(",")[0] == "bucket", (table, columns)
    # A bucket per shard, three on each worker.
    assert len(layout.keys) == len(set(layout.keys)) == BUCKETS
    per_worker = [list(workers.values()).count(w) for w in set(workers.values())]
    assert sorted(per_worker) == [3, 3]


def test_a_partitions_batch_and_its_relay_claim_run_on_its_buckets_worker_alone(
    citus_url: str, schema: str, layout: Buckets
) -> None:
    tables = Tables(schema)
    with psycopg.connect(citus_url, autocommit=True) as conn:
        workers = workers_of(conn, schema)
    remote = Remote()
    store = PostgresBatchStore(lambda: remote.connect(citus_url), tables, "g")
    relay = PostgresOutboxStore(lambda: remote.connect(citus_url), tables, "g")
    try:
        store.claim([("in", p) for p in range(BUCKETS)], "r0")
        for partition in (0, 1):
            sagas = ids_in(partition, 5)
            remote.commands.clear()
            start_sagas(store, partition, sagas)
            home = workers[layout.of_partition(partition)]
            assert remote.nodes() == {home}, remote.commands
            assert any("COPY" in m and "saga_instance" in m for m, _ in remote.commands)

            remote.commands.clear()
            loaded = store.load(
                Wants({(SAGA, s) for s in sagas}, {(SAGA, s, f"m-{s}") for s in sagas}, set())
            )
            assert set(loaded.sagas) == {(SAGA, s) for s in sagas}
            assert loaded.applied == {(SAGA, s, f"m-{s}") for s in sagas}
            assert remote.nodes() == {home}

            remote.commands.clear()
            with relay.claim(100, {("in", partition): 1}) as rows:
                assert rows is not None
                assert sorted(r.row.saga_id or "" for r in rows) == sorted(sagas)
            # The claim's partition statements ran on the home worker; the global path
            # (rows of no partition, none here) probes every bucket.
            partition_commands = [
                d for m, d in remote.commands if "consumer_offset" in m or "DELETE" in m
            ]
            assert partition_commands
            assert all(home in d for d in partition_commands)
    finally:
        store.close()
        relay.close()


HOT: dict[str, tuple[str, Callable[[Int4, tuple[int, ...]], Any]]] = {
    "load": (
        sql_buckets.LOAD,
        lambda k, keys: {"keys": '[["t", "s"]]', "mkeys": '[["t", "s", "m"]]', "bucket": k},
    ),
    "update_sagas": (
        sql_buckets.UPDATE_SAGAS,
        lambda k, keys: ('[["t", "s", null, "active", 2, null, 1, null, 1]]', k),
    ),
    "clear_deadlines": (sql_buckets.CLEAR_DEADLINES, lambda k, keys: ('[["t", "s"]]', k)),
    "delete_deadlines": (
        sql_buckets.DELETE_DEADLINES,
        lambda k, keys: ('[["t", "s", "n"]]', k),
    ),
    "commit_offsets": (
        sql_buckets.COMMIT_OFFSETS,
        lambda k, keys: (["in"], [0], [1], [None], [1], k, "g"),
    ),
    "lock_owned": (sql_buckets.LOCK_OWNED, lambda k, keys: (k, "g", ["in"], [0])),
    "read_offsets": (sql_buckets.READ_OFFSETS, lambda k, keys: (k, "g", ["in"], [0])),
}


@pytest.mark.parametrize("name", sorted(HOT))
def test_each_hot_statement_that_names_a_bucket_has_a_router_plan(
    citus_url: str, schema: str, layout: Buckets, name: str
) -> None:
    text, params = HOT[name]
    rendered = Tables(schema).render(text)
    key = Int4(layout.key(0))
    with psycopg.connect(citus_url) as conn:
        plan = "\n".join(
            r[0] for r in conn.execute(f"EXPLAIN {rendered}", params(key, layout.keys)).fetchall()
        )
    assert "Task Count: 1" in plan, plan


def test_the_relays_claim_of_a_buckets_partitions_is_one_router_planned_statement(
    citus_url: str, schema: str, layout: Buckets
) -> None:
    # The lock of the partitions' offsets rows, the choice of their oldest rows and the delete,
    # when the partitions' sagas are their own bucket's: one task on the bucket's worker.
    from processor._postgres.outbox import _CLAIM_OWNED_B

    params = {
        "bucket": Int4(layout.key(0)),
        "group": "g",
        "t": ["in"],
        "p": [0],
        "e": [1],
        "limit": 100,
        "max_bytes": 1_000_000,
    }
    with psycopg.connect(citus_url) as conn:
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                f"EXPLAIN {Tables(schema).render(_CLAIM_OWNED_B)}", params
            ).fetchall()
        )
    assert "Task Count: 1" in plan, plan
    assert plan.count("Task\n") == 1 or plan.count("->  Task") == 1, plan


def test_a_distributed_schema_moves_to_buckets_with_its_rows_ids_and_grants(
    citus_url: str, schema: str
) -> None:
    tables = Tables(schema)
    sagas = {p: ids_in(p, 2) for p in (0, 1)}
    with psycopg.connect(citus_url) as conn:
        migrate(conn, tables, "citus")
        conn.commit()
        assert distributed(conn, schema)
    old = PostgresBatchStore(lambda: connect(citus_url), tables, "g")
    try:
        old.claim([("in", 0), ("in", 1)], "r0")
        for partition, ids in sagas.items():
            start_sagas(old, partition, ids)
    finally:
        old.close()
    q = functools.partial(_rows, citus_url, schema)
    with psycopg.connect(citus_url, autocommit=True) as conn:
        conn.execute(sql.SQL("GRANT SELECT ON {}.saga_instance TO PUBLIC").format(
            sql.Identifier(schema)))  # fmt: skip
    outbox = q("SELECT id, saga_id FROM {}.outbox ORDER BY id")
    history = q("SELECT id, saga_id, message_id FROM {}.saga_history ORDER BY id")
    assert len(outbox) == len(history) == 4

    # A replica's start refuses: replicas still running would write the old tables.
    with psycopg.connect(citus_url) as conn, pytest.raises(ConfigurationError) as refused:
        migrate(conn, tables, "buckets", buckets=BUCKETS)
    assert "saga-processor migrate" in str(refused.value)

    with psycopg.connect(citus_url) as conn:
        assert migrate(conn, tables, "buckets", buckets=BUCKETS, move=True) == len(MIGRATIONS)
        conn.commit()
        assert not distributed(conn, schema)
        layout = read_layout(conn, schema)
        assert layout is not None
        spread = conn.execute(
            "SELECT count(DISTINCT nodeport) FROM citus_shards WHERE table_name = %s::regclass",
            (f"{schema}.outbox",),
        ).fetchone()
        assert spread == (2,)
        readable = conn.execute(
            "SELECT has_table_privilege('public', %s, 'SELECT')", (f"{schema}.saga_instance",)
        ).fetchone()
        assert readable == (True,)
    # Every row, with its id, on its saga's bucket; the versions as they were.
    assert q("SELECT id, saga_id FROM {}.outbox ORDER BY id") == outbox
    assert q("SELECT id, saga_id, message_id FROM {}.saga_history ORDER BY id") == history
    placed = dict(q("SELECT saga_id, bucket FROM {}.saga_instance"))
    assert placed == {s: layout.of(s) for ids in sagas.values() for s in ids}
    assert sorted(q("SELECT partition, bucket, next_offset FROM {}.consumer_offset")) == [
        (p, layout.of_partition(p), 2) for p in (0, 1)
    ]
    assert q("SELECT max(version) FROM {}.schema_version") == [(len(MIGRATIONS),)]

    # The processor goes on on buckets: the next ids come after the old ones.
    new = PostgresBatchStore(lambda: connect(citus_url), tables, "g")
    try:
        [(epoch, stored)] = new.claim([("in", 0)], "r1").values()
        assert stored == 2
        later = ids_in(0, 3)[2]
        new.write(
            WriteSet(
                sagas=[SagaWrite(SAGA, later, {"n": 1}, SagaStatus.ACTIVE, 1, None, None)],
                outbox=[OutboxRow(SAGA, later, "out", b"k", {}, b"v", None, ("in", 0))],
            ),
            [OffsetCommit("in", 0, 3, 2, epoch)],
        )
    finally:
        new.close()
    [(after,)] = q("SELECT id FROM {}.outbox WHERE saga_id = %s", later)
    assert after > max(i for i, _ in outbox)
    assert q("SELECT bucket, next_offset FROM {}.consumer_offset WHERE partition = 0") == [
        (layout.of_partition(0), 3)
    ]


def _rows(url: str, schema: str, text: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        query = sql.SQL(text).format(sql.Identifier(schema))
        return conn.execute(query, args).fetchall()


def test_processes_on_buckets_are_not_moved_to_a_node(
    citus_url: str, schema: str, layout: Buckets
) -> None:
    # `saga-processor citus-node move` names why: every bucket is reached through the
    # coordinator, and nothing is pinned.
    with psycopg.connect(citus_url, autocommit=True) as conn:
        with pytest.raises(MoveRefused) as refused:
            move_pin(conn, schema, "ana")
        assert "distributed by bucket over the workers" in str(refused.value)
        assert pinned_node(conn, schema) is None


def test_buckets_without_a_count_refuse_to_make_the_tables(citus_url: str, schema: str) -> None:
    with psycopg.connect(citus_url) as conn, pytest.raises(ConfigurationError) as refused:
        migrate(conn, Tables(schema), "buckets")
    assert "SAGA_DATABASE__BUCKETS" in str(refused.value)


def test_a_second_start_keeps_the_layout_and_refuses_another_partitioner(
    citus_url: str, schema: str, layout: Buckets
) -> None:
    with psycopg.connect(citus_url) as conn:
        migrate(conn, Tables(schema), "buckets", buckets=12)
        conn.commit()
        assert read_layout(conn, schema) == layout
        with pytest.raises(ConfigurationError) as refused:
            migrate(conn, Tables(schema), "buckets", partitioner="murmur2")
    assert "SAGA_CONSUMER__PARTITIONER" in str(refused.value)


def test_a_relay_round_takes_one_workers_rows_and_says_the_others_wait(
    citus_url: str, schema: str, layout: Buckets
) -> None:
    tables = Tables(schema)
    with psycopg.connect(citus_url, autocommit=True) as conn:
        workers = workers_of(conn, schema)
    # Partition 0 and one whose bucket is on the other worker.
    other = next(
        p for p in range(1, BUCKETS) if workers[layout.of_partition(p)] != workers[layout.key(0)]
    )
    remote = Remote()
    store = PostgresBatchStore(lambda: remote.connect(citus_url), tables, "g")
    relay = PostgresOutboxStore(lambda: remote.connect(citus_url), tables, "g")
    sent: dict[int, list[str]] = {}
    try:
        store.claim([("in", 0), ("in", other)], "r0")
        # The input topic's partition count, as the growth watch records it: the relay knows
        # each partition's sagas are its own bucket's.
        with psycopg.connect(citus_url, autocommit=True) as conn:
            conn.execute(
                tables.render(
                    "INSERT INTO {partition_count} (group_id, topic, count) VALUES ('g', 'in', %s)"
                ),
                (BUCKETS,),
            )
        for partition in (0, other):
            sent[partition] = ids_in(partition, 3)
            store.write(
                WriteSet(
                    outbox=[
                        OutboxRow(SAGA, s, "out", s.encode(), {}, b"v", None, ("in", partition))
                        for s in sent[partition]
                    ]
                ),
                [OffsetCommit("in", partition, 3, None, 1)],
            )
        owned = {("in", 0): 1, ("in", other): 1}
        rounds = []
        waiting = []
        for _ in range(2):
            remote.commands.clear()
            with relay.claim(100, owned) as rows:
                assert rows is not None
                rounds.append(sorted(r.row.saga_id or "" for r in rows))
            deletes = {
                d.split("@", 1)[1].split(" ")[0] for m, d in remote.commands if "DELETE" in m
            }
            assert len(deletes) == 1, remote.commands
            waiting.append(relay.more_waiting)
        assert sorted(map(tuple, rounds)) == sorted(
            (tuple(sorted(sent[0])), tuple(sorted(sent[other])))
        )
        # A wake-up no one named: each worker is looked at once, the other's turn at once.
        assert waiting == [True, False]
        empty = []
        for _ in range(2):
            with relay.claim(100, owned) as rows:
                assert rows == []
            empty.append(relay.more_waiting)
        assert empty == [True, False]

        # Told which partition's rows were committed, the relay looks at its worker alone.
        more = ids_in(other, 5)[3:]
        store.write(
            WriteSet(
                outbox=[
                    OutboxRow(SAGA, s, "out", s.encode(), {}, b"v", None, ("in", other))
                    for s in more
                ]
            ),
            [OffsetCommit("in", other, 5, 3, 1)],
        )
        relay.expect([("in", other)])
        remote.commands.clear()
        with relay.claim(100, owned) as rows:
            assert rows is not None
            assert sorted(r.row.saga_id or "" for r in rows) == sorted(more)
        assert {d.split("@", 1)[1].split(" ")[0] for _, d in remote.commands if "@" in d} == {
            workers[layout.of_partition(other)]
        }
        assert not relay.more_waiting
    finally:
        store.close()
        relay.close()


def test_each_processors_buckets_are_a_colocation_group_of_their_own(
    citus_url: str, schema: str, layout: Buckets
) -> None:
    # Joined to another schema's group, a bucket moved between workers would move the other
    # processor's shards with it.
    other = f"{schema}_b"
    try:
        with psycopg.connect(citus_url) as conn:
            migrate(conn, Tables(other), "buckets", buckets=BUCKETS)
            conn.commit()
            groups = conn.execute(
                "SELECT DISTINCT colocation_id FROM citus_tables"
                " WHERE table_name = ANY(%s::regclass[])",
                ([f"{schema}.saga_instance", f"{other}.saga_instance"],),
            ).fetchall()
    finally:
        with psycopg.connect(citus_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(other)))
    assert len(groups) == 2


def test_plain_tables_with_rows_move_to_buckets_only_by_an_operators_migrate(
    citus_url: str, schema: str
) -> None:
    tables = Tables(schema)
    sagas = {p: ids_in(p, 2) for p in (0, 1)}
    with psycopg.connect(citus_url) as conn:
        migrate(conn, tables, "off")
        conn.commit()
    plain = PostgresBatchStore(lambda: connect(citus_url), tables, "g")
    try:
        plain.claim([("in", 0), ("in", 1)], "r0")
        for partition, ids in sagas.items():
            start_sagas(plain, partition, ids)
    finally:
        plain.close()

    # A replica's start refuses: replicas still running would not fit the moved tables.
    with psycopg.connect(citus_url) as conn, pytest.raises(ConfigurationError) as refused:
        migrate(conn, tables, "buckets", buckets=BUCKETS)
    assert "saga-processor migrate" in str(refused.value)

    with psycopg.connect(citus_url) as conn:
        migrate(conn, tables, "buckets", buckets=BUCKETS, move=True)
        conn.commit()
        layout = read_layout(conn, schema)
        assert layout is not None
        spread = conn.execute(
            "SELECT count(DISTINCT nodeport) FROM citus_shards WHERE table_name = %s::regclass",
            (f"{schema}.saga_instance",),
        ).fetchone()
        assert spread == (2,)
        placed = conn.execute(
            sql.SQL("SELECT saga_id, bucket FROM {}.saga_instance").format(sql.Identifier(schema))
        ).fetchall()
        offsets = conn.execute(
            sql.SQL("SELECT partition, bucket, next_offset FROM {}.consumer_offset").format(
                sql.Identifier(schema)
            )
        ).fetchall()
    assert {s: b for s, b in placed} == {s: layout.of(s) for ids in sagas.values() for s in ids}
    assert sorted(offsets) == [(p, layout.of_partition(p), 2) for p in (0, 1)]

    # The moved rows carry on: each saga loads, its history says its record was applied.
    store = PostgresBatchStore(lambda: connect(citus_url), tables, "g")
    try:
        every = [s for ids in sagas.values() for s in ids]
        loaded = store.load(
            Wants({(SAGA, s) for s in every}, {(SAGA, s, f"m-{s}") for s in every}, set())
        )
        assert set(loaded.sagas) == {(SAGA, s) for s in every}
        assert len(loaded.applied) == len(every)
        assert store.read_offsets([("in", 0), ("in", 1)]) == {
            ("in", 0): (1, 2),
            ("in", 1): (1, 2),
        }
    finally:
        store.close()


def test_check_says_how_the_buckets_spread_over_the_workers(
    citus_url: str, schema: str, layout: Buckets
) -> None:
    with psycopg.connect(citus_url, autocommit=True) as conn:
        source = PostgresCheckSource(conn, Tables(schema))
        where = source.distribution()
        assert source.buckets() == BUCKETS
        workers = sorted(set(workers_of(conn, schema).values()))
    assert where is not None
    assert "distributed by bucket on Citus" in where
    assert f"{BUCKETS} buckets (crc32)" in where
    for worker in workers:
        assert f"{worker} (3)" in where
