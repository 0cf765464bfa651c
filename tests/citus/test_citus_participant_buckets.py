"""A participant service's tables distributed by bucket (``SAGA_DATABASE__DISTRIBUTED=buckets``).

The kit's inbox, outbox, failed outbox and positions are distributed by the bucket of each
command's key, co-located; the service's own tables follow when they carry a ``bucket`` column
and become reference tables when they do not. A command's inbox row, the handler's rows by
bucket, its reply and its partition's position commit on the worker of its bucket alone (read
from the commands Citus logs), and each statement that names a bucket gets a router plan.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from processor._authoring.messages import Message, MessageRegistry, message_type
from processor._engine.buckets import Buckets
from processor._engine.records import OutboxRow, Record
from processor._errors import ConfigurationError
from processor._postgres.connect import connect
from processor._postgres.outbox import PostgresOutboxStore
from processor._postgres.participant import PostgresParticipantStore
from processor._postgres.schema.buckets import read_layout
from processor._postgres.schema.citus import distributed
from processor._postgres.schema.participant import (
    PARTICIPANT_BY_BUCKET,
    migrate_participant,
    migrate_service,
)
from processor._postgres.schema.tables import Tables
from processor.participant import (
    Bucket,
    Claim,
    CommandKit,
    Replies,
    Sql,
    command_handler,
    participant,
)
from tests.citus.test_citus_buckets import Remote

pytestmark = pytest.mark.integration

BUCKETS = 6
GROUP = "svc"
HOLD = (
    "CREATE TABLE hold (bucket int NOT NULL, order_id text NOT NULL, n int NOT NULL,"
    " PRIMARY KEY (bucket, order_id))"
)
ACCOUNT = "CREATE TABLE account (id text PRIMARY KEY, balance int NOT NULL)"


@pytest.fixture
def schema(citus_url: str) -> Iterator[str]:
    name = f"t_pbucket_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(citus_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def layout(citus_url: str, schema: str) -> Buckets:
    with psycopg.connect(citus_url, autocommit=True) as conn:
        migrate_participant(conn, Tables(schema), "buckets", buckets=BUCKETS)
        assert migrate_service(conn, Tables(schema), [HOLD, ACCOUNT]) == 2
        found = read_layout(conn, schema)
    assert found is not None
    return found


def placement(conn: psycopg.Connection[Any], schema: str) -> dict[str, tuple[str, int]]:
    """Each table of the schema Citus knows: its method ('h' hash, 'n' reference) and group."""
    rows = conn.execute(
        "SELECT c.relname, d.partmethod, d.colocationid FROM pg_dist_partition AS d"
        " JOIN pg_class AS c ON c.oid = d.logicalrelid"
        " WHERE c.relnamespace = to_regnamespace(%s)",
        (schema,),
    ).fetchall()
    return {str(r[0]): (str(r[1]), int(r[2])) for r in rows}


def test_the_kits_tables_and_the_services_follow_the_inbox_or_are_shared(
    citus_url: str, schema: str, layout: Buckets
) -> None:
    with psycopg.connect(citus_url, autocommit=True) as conn:
        placed = placement(conn, schema)
        assert not distributed(conn, schema)
        shards = conn.execute(
            "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = %s::regclass",
            (f"{schema}.inbox",),
        ).fetchone()
        keys = {
            str(r[0]): str(r[1])
            for r in conn.execute(
                "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE connamespace = to_regnamespace(%s) AND contype = 'p'",
                (schema,),
            ).fetchall()
        }
    group = placed["inbox"][1]
    # The kit's tables and the service's table with a bucket column: one co-location group.
    for table in [*PARTICIPANT_BY_BUCKET, "hold"]:
        assert placed[table] == ("h", group), table
    assert shards == (BUCKETS,)
    # Shared by every bucket's commands: a copy on every worker.
    for table in ("account", "participant_schema_version", "service_schema_version"):
        assert placed[table][0] == "n", table
    assert layout.count == BUCKETS
    for table in [*PARTICIPANT_BY_BUCKET, "hold"]:
        assert keys[f"{schema}.{table}"].startswith("PRIMARY KEY (bucket,"), keys


def test_a_later_service_migration_distributes_its_new_tables_too(
    citus_url: str, schema: str, layout: Buckets
) -> None:
    later = "CREATE TABLE note (bucket int NOT NULL, id text, PRIMARY KEY (bucket, id))"
    with psycopg.connect(citus_url, autocommit=True) as conn:
        assert migrate_service(conn, Tables(schema), [HOLD, ACCOUNT, later]) == 1
        placed = placement(conn, schema)
    assert placed["note"] == ("h", placed["inbox"][1])


@pytest.mark.parametrize(
    ("ddl", "says"),
    [
        (
            "CREATE TABLE hold (bucket int NOT NULL DEFAULT 0, order_id text,"
            " PRIMARY KEY (bucket, order_id))",
            "its bucket column has a default",
        ),
        (
            "CREATE TABLE hold (bucket int NOT NULL, order_id text PRIMARY KEY)",
            "its primary key and unique indexes must include bucket",
        ),
    ],
    ids=["default", "key-without-bucket"],
)
def test_a_service_table_that_cannot_follow_its_bucket_is_refused_by_name(
    citus_url: str, schema: str, ddl: str, says: str
) -> None:
    with psycopg.connect(citus_url, autocommit=True) as conn:
        migrate_participant(conn, Tables(schema), "buckets", buckets=BUCKETS)
        with pytest.raises(ConfigurationError) as refused:
            migrate_service(conn, Tables(schema), [ddl])
        assert f"service table {schema}.hold" in str(refused.value)
        assert says in str(refused.value)
        # Nothing of it is left half distributed; the next start says it again.
        assert "hold" not in placement(conn, schema)


def test_buckets_need_a_count_and_a_schema_with_rows_is_not_moved(
    citus_url: str, schema: str
) -> None:
    tables = Tables(schema)
    with psycopg.connect(citus_url, autocommit=True) as conn:
        with pytest.raises(ConfigurationError, match="SAGA_PARTICIPANT__BUCKETS"):
            migrate_participant(conn, tables, "buckets")
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        migrate_participant(conn, tables, "off")
        conn.execute(
            f'INSERT INTO "{schema}".inbox (message_id, message_type, outcome, topic,'
            " partition, \"offset\") VALUES ('m', 't', 'handled', 'c', 0, 0)"
        )
        with pytest.raises(ConfigurationError, match="holds rows"):
            migrate_participant(conn, tables, "buckets", buckets=BUCKETS)


def test_a_distributed_schema_made_before_stays_one_and_says_so(
    citus_url: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    with psycopg.connect(citus_url, autocommit=True) as conn:
        migrate_participant(conn, Tables(schema), "citus")
        migrate_participant(conn, Tables(schema), "buckets", buckets=BUCKETS)
        assert distributed(conn, schema)
        assert read_layout(conn, schema) is None
    assert "stays one" in caplog.text


def key_in(bucket_partition: int) -> bytes:
    """A key that librdkafka's default partitioner sends to ``bucket_partition`` of 6."""
    return next(
        k
        for k in (f"order-{i}".encode() for i in range(10_000))
        if zlib.crc32(k) % BUCKETS == bucket_partition
    )


def workers(conn: psycopg.Connection[Any], schema: str, layout: Buckets) -> dict[int, str]:
    """Each bucket value's worker, "host:port", from the inbox's shards."""
    rows = conn.execute(
        "SELECT s.shardminvalue::int, p.nodename || ':' || p.nodeport FROM pg_dist_shard AS s"
        " JOIN citus_shards AS p ON p.shardid = s.shardid"
        " WHERE s.logicalrelid = %s::regclass",
        (f"{schema}.inbox",),
    ).fetchall()
    by_min = dict(rows)
    return {layout.key(b): by_min[sorted(by_min)[b]] for b in range(layout.count)}


def test_a_commands_rows_commit_on_its_buckets_worker_and_a_redelivery_is_seen(
    citus_url: str, schema: str, layout: Buckets
) -> None:
    with psycopg.connect(citus_url, autocommit=True) as conn:
        homes = workers(conn, schema, layout)
    assert len(set(homes.values())) == 2  # the buckets spread over both workers
    remote = Remote()
    tables = Tables(schema)
    store = PostgresParticipantStore(lambda: remote.connect(citus_url), tables)
    relay = PostgresOutboxStore(lambda: remote.connect(citus_url), tables, anchor="inbox")
    try:
        for partition in (0, 1):
            key = key_in(partition)
            bucket = layout.of_key(key)
            home = homes[bucket]
            # The command topic has as many partitions as buckets: its position is there too.
            assert layout.of_partition(partition) == bucket
            mid = f"m-{partition}"
            reply = OutboxRow(
                "order", key.decode(), "replies", key, {"message-id": f"r-{mid}"}, b"{}"
            )
            remote.commands.clear()
            with store.transaction() as tx:
                assert tx.claim_all([Claim(mid, "Hold", "commands", partition, 7, key)]) == {
                    mid: None
                }
                assert tx.bucket_of(mid) == bucket
                tx.sql.execute(
                    f'INSERT INTO "{schema}".hold (bucket, order_id, n) VALUES (%s, %s, 1)',
                    (tx.bucket_of(mid), key.decode()),
                )
                tx.finish(mid, "handled", [reply])
                tx.advance(GROUP, "commands", partition, 8)
            assert remote.nodes() == {home}, remote.commands

            # Delivered again: the inbox row of its bucket answers, with the reply stored.
            with store.transaction() as tx:
                seen = tx.claim(mid, "Hold", "commands", partition, 7, key)
                assert seen is not None
                assert (seen.outcome, seen.replies) == ("handled", (reply,))

            remote.commands.clear()
            with relay.claim(100) as rows:
                assert rows is not None
                assert [r.row.headers["message-id"] for r in rows] == [f"r-{mid}"]
            deleted = [d for m, d in remote.commands if "DELETE" in m]
            assert deleted
            assert all(home in d for d in deleted)
        assert store.positions(GROUP, [("commands", 0), ("commands", 1)]) == {
            ("commands", 0): 8,
            ("commands", 1): 8,
        }
    finally:
        store.close()
        relay.close()


def test_each_statement_that_names_a_bucket_has_a_router_plan(
    citus_url: str, schema: str, layout: Buckets
) -> None:
    from processor._postgres import participant

    tables = Tables(schema)
    key = layout.key(0)
    inbox = f'"{schema}".inbox'
    statements = {
        "seen": (
            f"SELECT outcome, replies FROM {inbox} WHERE bucket = %s::int AND message_id = %s",
            (key, "m"),
        ),
        "seen_all": (
            f"SELECT message_id FROM {inbox} WHERE bucket = %s::int AND message_id = ANY(%s)",
            (key, ["m"]),
        ),
        "finish": (
            f"UPDATE {inbox} AS i SET outcome = u.o, replies = u.r FROM unnest(%s::text[],"
            " %s::text[], %s::jsonb[]) AS u(m, o, r) WHERE i.bucket = %s::int AND"
            " i.message_id = u.m",
            (["m"], ["handled"], ["[]"], key),
        ),
        "advance": (tables.render(participant._ADVANCE_B), (key, GROUP, "c", 0, 1)),
        "claim": (
            f"INSERT INTO {inbox} (message_id, message_type, outcome, topic, partition,"
            ' "offset", bucket) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING'
            " RETURNING 1",
            ("m", "t", "pending", "c", 0, 0, key),
        ),
    }
    with psycopg.connect(citus_url) as conn:
        for name, (text, params) in statements.items():
            plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {text}", params).fetchall())
            assert "Task Count: 1" in plan or "Router" in plan, (name, plan)


REG = MessageRegistry()


@message_type("t.Hold", topic="cmds", registry=REG)
class HoldCommand(Message):
    order_id: str


@message_type("t.Held", topic="events", registry=REG)
class Held(Message):
    order_id: str


@participant(name="holder")
class Holder:
    @command_handler
    def hold(self, command: HoldCommand, replies: Replies, sql: Sql, bucket: Bucket) -> None:
        sql.execute(
            "INSERT INTO hold (bucket, order_id, n) VALUES (%s, %s, 1)",
            (bucket, command.order_id),
        )
        replies.send(Held(order_id=command.order_id))


def command(order: str, partition: int, offset: int) -> Record:
    headers = {
        "message-id": f"m-{order}",
        "message-type": "t.Hold",
        "saga-type": "order-saga",
        "saga-id": order,
        "correlation-id": "c",
    }
    return Record(
        "cmds",
        partition,
        offset,
        order.encode(),
        HoldCommand(order_id=order).model_dump_json().encode(),
        tuple((k, v.encode()) for k, v in headers.items()),
    )


def test_a_handler_writes_its_rows_with_the_bucket_it_asks_for(
    citus_url: str, schema: str, layout: Buckets
) -> None:
    store = PostgresParticipantStore(lambda: connect(citus_url, search_path=schema), Tables(schema))
    kit = CommandKit(
        [Holder()], store, group_id=GROUP, dead_letter_topic="dead", message_registry=REG
    )
    orders = [key_in(p).decode() for p in range(BUCKETS)]
    try:
        # One consumer batch over every bucket, so over both workers; then one redelivered.
        assert kit.handle_together([command(o, p, 0) for p, o in enumerate(orders)])
        assert kit.handle(command(orders[0], 0, 0)) == "duplicate"
    finally:
        store.close()
    with psycopg.connect(citus_url, autocommit=True) as conn:
        held = conn.execute(f'SELECT order_id, bucket FROM "{schema}".hold').fetchall()
        inbox = conn.execute(f'SELECT message_id, bucket FROM "{schema}".inbox').fetchall()
        replies = conn.execute(f'SELECT key, bucket FROM "{schema}".outbox').fetchall()
    assert sorted(held) == sorted((o, layout.of_key(o.encode())) for o in orders)
    assert sorted(inbox) == sorted((f"m-{o}", layout.of_key(o.encode())) for o in orders)
    assert sorted((bytes(k), b) for k, b in replies) == sorted(
        (o.encode(), layout.of_key(o.encode())) for o in orders + orders[:1]
    )
    assert kit.counters.handled == BUCKETS
    assert kit.counters.duplicates == 1
