"""One set of participant store cases, run against the in-memory store, the SQLite-backed one
and the PostgreSQL one.

All must agree on the kit's tables: a command's inbox row, its outcome and replies, the outbox
and the stored positions commit together when the transaction's block ends normally, and not at
all when it raises; a command seen before comes back with its outcome and replies as first
stored; positions only move forward. The handler's SQL (SQLite and PostgreSQL only; the plain
memory store records statements and returns no rows) sees its own writes, rolls back with the
command, and turns a refused row into ``RecordDataError``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

import pytest

from processor._engine.records import OutboxRow
from processor._errors import RecordDataError, RuntimeFailure
from processor._memory.participant import MemoryParticipantStore
from processor._memory.participant_sqlite import SqliteParticipantStore
from processor.participant import Claim, InboxEntry, ParticipantStore
from tests.support.harness import wait_until
from tests.support.phases import CITUS_BUCKETS, CITUS_LAYOUT

STOCK = "CREATE TABLE stock (sku text PRIMARY KEY, n integer NOT NULL CHECK (n >= 0))"
GROUP = "svc-group"


class Backend(Protocol):
    store: ParticipantStore

    def replica(self) -> ParticipantStore:
        """Another replica's store over the same tables."""
        ...

    def outbox(self) -> list[OutboxRow]:
        """Every row queued in the outbox, in order."""
        ...

    def waiting(self) -> bool:
        """Whether some transaction waits for another's lock."""
        ...

    def close(self) -> None: ...


class MemoryBackend:
    def __init__(self) -> None:
        self.memory = MemoryParticipantStore()
        self.store: ParticipantStore = self.memory

    def replica(self) -> ParticipantStore:
        return self.memory

    def outbox(self) -> list[OutboxRow]:
        return list(self.memory.tables.outbox)

    def waiting(self) -> bool:
        return False

    def close(self) -> None:
        self.memory.close()


class SqliteBackend:
    def __init__(self) -> None:
        self.sqlite = SqliteParticipantStore(STOCK)
        self.store: ParticipantStore = self.sqlite

    def replica(self) -> ParticipantStore:
        return self.sqlite

    def outbox(self) -> list[OutboxRow]:
        return list(self.sqlite.memory.tables.outbox)

    def waiting(self) -> bool:
        return False

    def close(self) -> None:
        self.sqlite.close()


class PostgresBackend:
    def __init__(self, url: str, schema: str) -> None:
        from processor._postgres.connect import connect
        from processor._postgres.participant import PostgresParticipantStore
        from processor._postgres.schema.participant import migrate_participant, migrate_service
        from processor._postgres.schema.tables import Tables

        self.tables = Tables(schema)
        self.admin = connect(url, autocommit=True)
        if os.environ.get(CITUS_LAYOUT) == "buckets":
            # The Citus phase's second layout: the kit's tables by bucket; the handlers' stock,
            # with no bucket column, a reference table (made by the service's migrations).
            migrate_participant(self.admin, self.tables, "buckets", buckets=CITUS_BUCKETS)
            migrate_service(self.admin, self.tables, [STOCK])
        else:
            migrate_participant(self.admin, self.tables)
            self.admin.execute(STOCK.replace("stock", f'"{schema}".stock'))
        self.made: list[PostgresParticipantStore] = []

        def replica() -> ParticipantStore:
            self.made.append(
                PostgresParticipantStore(lambda: connect(url, search_path=schema), self.tables)
            )
            return self.made[-1]

        self.replica = replica
        self.store: ParticipantStore = replica()

    def outbox(self) -> list[OutboxRow]:
        rows = self.admin.execute(
            self.tables.render(
                "SELECT saga_type, saga_id, topic, key, headers, value, partition FROM {outbox}"
                " ORDER BY id"
            )
        ).fetchall()
        return [OutboxRow(*row) for row in rows]

    def waiting(self) -> bool:
        # On Citus the row lock is waited for on a worker, whose backends only Citus's view of
        # the whole cluster shows. This connection itself never waits for a lock.
        citus = self.admin.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'")
        view = "citus_stat_activity" if citus.fetchone() else "pg_stat_activity"
        found = self.admin.execute(
            f"SELECT count(*) FROM {view} WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()"
        ).fetchone()
        return found is not None and int(found[0]) > 0

    def close(self) -> None:
        for store in self.made:
            store.close()
        self.admin.close()


POSTGRES = pytest.param("postgres", marks=pytest.mark.integration)


def _make(request: pytest.FixtureRequest) -> Backend:
    if request.param == "memory":
        return MemoryBackend()
    if request.param == "sqlite":
        return SqliteBackend()
    return PostgresBackend(
        request.getfixturevalue("database_url"), request.getfixturevalue("pg_schema")
    )


@pytest.fixture(params=["memory", "sqlite", POSTGRES])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    made = _make(request)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(params=["sqlite", POSTGRES])
def sql_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The stores whose handlers' SQL runs on a database."""
    made = _make(request)
    try:
        yield made
    finally:
        made.close()


class Undo(Exception):
    """Leaves a transaction's block so that nothing in it commits."""


def reply(n: int, *, saga_id: str | None = "s-1") -> OutboxRow:
    return OutboxRow(
        "order" if saga_id else None,
        saga_id,
        "replies",
        f"k{n}".encode(),
        {"message-id": f"r-{n}", "causation-id": "c-1"},
        f'{{"n": {n}, "text": "\\u00e9\\n"}}'.encode(),
    )


def claim(store: ParticipantStore, mid: str, offset: int = 0) -> InboxEntry | None:
    """What a claim of ``mid`` finds now, without leaving a row behind."""
    found: list[InboxEntry | None] = []
    try:
        with store.transaction() as tx:
            found.append(tx.claim(mid, "Reserve", "commands", 0, offset))
            raise Undo
    except Undo:
        pass
    return found[0]


# -- inbox, outbox, positions ----------------------------------------------------------------


def test_a_finished_command_comes_back_with_its_outcome_and_replies(backend: Backend) -> None:
    store = backend.store
    replies = [reply(1), reply(2, saga_id=None)]
    with store.transaction() as tx:
        assert tx.claim("c-1", "Reserve", "commands", 0, 7) is None
        tx.finish("c-1", "handled", replies)
        tx.advance(GROUP, "commands", 0, 8)

    assert claim(store, "c-1") == InboxEntry("c-1", "handled", tuple(replies))
    assert backend.outbox() == replies
    assert store.positions(GROUP, [("commands", 0)]) == {("commands", 0): 8}
    assert claim(store, "c-2") is None


def test_a_claimed_command_not_finished_is_pending(backend: Backend) -> None:
    with backend.store.transaction() as tx:
        assert tx.claim("c-1", "Reserve", "commands", 0, 0) is None
    assert claim(backend.store, "c-1") == InboxEntry("c-1", "pending", ())
    assert backend.outbox() == []


def test_a_block_that_raises_commits_nothing(backend: Backend) -> None:
    store = backend.store
    with store.transaction() as tx:
        tx.advance(GROUP, "commands", 0, 3)

    def undone() -> None:
        with store.transaction() as tx:
            assert tx.claim("c-1", "Reserve", "commands", 0, 3) is None
            tx.finish("c-1", "handled", [reply(1)])
            tx.publish([reply(2)])
            tx.advance(GROUP, "commands", 0, 4)
            raise Undo

    with pytest.raises(Undo):
        undone()

    assert claim(store, "c-1") is None
    assert backend.outbox() == []
    assert store.positions(GROUP, [("commands", 0)]) == {("commands", 0): 3}


def test_published_rows_queue_in_order_with_the_replies(backend: Backend) -> None:
    store = backend.store
    with store.transaction() as tx:
        tx.publish([reply(1), reply(2)])
        tx.publish([])
        assert tx.claim("c-1", "Reserve", "commands", 0, 0) is None
        tx.finish("c-1", "dead-lettered", [reply(3)])
    with store.transaction() as tx:
        tx.publish([reply(4)])

    assert backend.outbox() == [reply(1), reply(2), reply(3), reply(4)]
    # Rows published beside the outcome are not the command's replies.
    entry = claim(store, "c-1")
    assert entry is not None
    assert (entry.outcome, entry.replies) == ("dead-lettered", (reply(3),))


def test_several_commands_commit_together_in_order(backend: Backend) -> None:
    # A consumer batch in one transaction: a command claimed again inside it sees the entry the
    # same transaction finished; the replies queue in order; the positions end at the furthest.
    store = backend.store
    with store.transaction() as tx:
        for n, mid in enumerate(["c-1", "c-2"]):
            assert tx.claim(mid, "Reserve", "commands", n % 2, 10 + n) is None
            tx.finish(mid, "handled", [reply(n + 1)])
            tx.advance(GROUP, "commands", n % 2, 11 + n)
        again = tx.claim("c-1", "Reserve", "commands", 0, 12)
        assert again == InboxEntry("c-1", "handled", (reply(1),))
        tx.publish(again.replies)
        tx.advance(GROUP, "commands", 0, 13)

    assert backend.outbox() == [reply(1), reply(2), reply(1)]
    assert store.positions(GROUP, [("commands", 0), ("commands", 1)]) == {
        ("commands", 0): 13,
        ("commands", 1): 12,
    }


def test_a_batch_claims_its_commands_at_once(backend: Backend) -> None:
    store = backend.store
    with store.transaction() as tx:
        assert tx.claim("c-1", "Reserve", "commands", 0, 1) is None
        tx.finish("c-1", "handled", [reply(1)])
    claims = [Claim(f"c-{n}", "Reserve", "commands", n % 2, 10 + n) for n in (3, 1, 2)]
    with store.transaction() as tx:
        found = tx.claim_all(claims)
        # New ones are claimed; the one seen before comes back with its outcome and replies.
        assert found == {"c-3": None, "c-1": InboxEntry("c-1", "handled", (reply(1),)), "c-2": None}
        assert tx.claim_all([]) == {}
        tx.finish("c-2", "handled", [reply(2)])
        # Finished earlier in the same transaction: seen with what it left.
        assert tx.claim("c-2", "Reserve", "commands", 0, 20) == InboxEntry(
            "c-2", "handled", (reply(2),)
        )
    assert claim(store, "c-3") == InboxEntry("c-3", "pending", ())
    assert claim(store, "c-2") == InboxEntry("c-2", "handled", (reply(2),))
    assert backend.outbox() == [reply(1), reply(2)]


def test_positions_move_only_forward_per_group_and_partition(backend: Backend) -> None:
    store = backend.store
    a, b, c = ("commands", 0), ("commands", 1), ("other", 0)
    assert store.positions(GROUP, [a, b]) == {a: None, b: None}
    with store.transaction() as tx:
        tx.advance(GROUP, *a, 10)
        tx.advance(GROUP, *b, 5)
        tx.advance("other-group", *a, 99)
    with store.transaction() as tx:
        tx.advance(GROUP, *a, 4)
        tx.advance(GROUP, *b, 6)

    assert store.positions(GROUP, [a, b, c]) == {a: 10, b: 6, c: None}
    assert store.positions("other-group", [a]) == {a: 99}
    assert store.positions(GROUP, []) == {}


def test_a_reply_keeps_its_partition_when_the_command_is_seen_again(backend: Backend) -> None:
    placed = OutboxRow("order", "s-1", "replies", b"k", {"message-id": "r-1"}, b"{}", 2)
    with backend.store.transaction() as tx:
        assert tx.claim("c-1", "Reserve", "commands", 0, 0) is None
        tx.finish("c-1", "handled", [placed])

    assert backend.outbox() == [placed]
    assert claim(backend.store, "c-1") == InboxEntry("c-1", "handled", (placed,))


@pytest.fixture
def pg_backend(database_url: str, pg_schema: str) -> Iterator[Backend]:
    """PostgreSQL alone: the memory stores are for one thread (a second transaction opened
    while one is open does not wait for it, and SQLite's connection belongs to its thread)."""
    made = PostgresBackend(database_url, pg_schema)
    try:
        yield made
    finally:
        made.close()


@pytest.mark.integration
def claim_in_batch(store: ParticipantStore, mid: str) -> InboxEntry | None:
    """What a batch's claim of ``mid`` (beside a new command) finds, leaving no row behind."""
    found: list[InboxEntry | None] = []
    try:
        with store.transaction() as tx:
            got = tx.claim_all(
                [
                    Claim("c-new", "Reserve", "commands", 0, 5),
                    Claim(mid, "Reserve", "commands", 0, 6),
                ]
            )
            found.append(got[mid])
            raise Undo
    except Undo:
        pass
    return found[0]


@pytest.mark.parametrize("claims", [claim, claim_in_batch], ids=["alone", "in-a-batch"])
def test_a_command_claimed_by_another_replica_meanwhile_is_seen_once_it_commits(
    pg_backend: Backend, claims: Callable[[ParticipantStore, str], InboxEntry | None]
) -> None:
    backend = pg_backend
    first, second = backend.store, backend.replica()
    found: list[InboxEntry | None] = []

    def other() -> None:
        found.append(claims(second, "c-1"))

    thread = threading.Thread(target=other, name="second-replica", daemon=True)
    with first.transaction() as tx:
        assert tx.claim("c-1", "Reserve", "commands", 0, 0) is None
        thread.start()
        # The other replica's claim waits for this one's row (or, wrongly, got past it).
        wait_until(
            lambda: backend.waiting() or not thread.is_alive(), 10, "the second claim to wait"
        )
        tx.finish("c-1", "handled", [reply(1)])
    thread.join(10)

    assert not thread.is_alive()
    assert found == [InboxEntry("c-1", "handled", (reply(1),))]


# -- the handlers' SQL -------------------------------------------------------------------------


def test_a_handlers_statements_see_their_own_writes_and_commit_with_the_command(
    sql_backend: Backend,
) -> None:
    store = sql_backend.store
    with store.transaction() as tx:
        assert tx.claim("c-1", "Reserve", "commands", 0, 0) is None
        added = tx.sql.execute(
            "INSERT INTO stock (sku, n) VALUES (%s, %s), (%s, %s)", ("a", 5, "b", 1)
        )
        assert added.rowcount == 2
        changed = tx.sql.execute(
            "UPDATE stock SET n = n - %(by)s WHERE sku = %(sku)s", {"by": 2, "sku": "a"}
        )
        assert changed.rowcount == 1
        rows = tx.sql.execute("SELECT sku, n FROM stock ORDER BY sku")
        assert rows.fetchone() == ("a", 3)
        assert rows.fetchall() == [("b", 1)]
        assert rows.fetchone() is None
        tx.finish("c-1", "handled", [])

    with store.transaction() as tx:
        assert tx.sql.execute("SELECT n FROM stock WHERE sku = %s", ("a",)).fetchall() == [(3,)]


def test_a_handlers_statements_roll_back_with_a_block_that_raises(sql_backend: Backend) -> None:
    store = sql_backend.store

    def undone() -> None:
        with store.transaction() as tx:
            tx.sql.execute("INSERT INTO stock (sku, n) VALUES (%s, %s)", ("a", 5))
            raise Undo

    with pytest.raises(Undo):
        undone()
    with store.transaction() as tx:
        assert tx.sql.execute("SELECT count(*) FROM stock").fetchone() == (0,)


def test_a_refused_row_is_record_data_and_the_command_cannot_commit_after_it(
    sql_backend: Backend,
) -> None:
    store = sql_backend.store
    with store.transaction() as tx:
        tx.sql.execute("INSERT INTO stock (sku, n) VALUES (%s, %s)", ("a", 1))

    def swallowed() -> None:
        with store.transaction() as tx:
            assert tx.claim("c-1", "Reserve", "commands", 0, 0) is None
            with pytest.raises(RecordDataError):
                tx.sql.execute("UPDATE stock SET n = n - 2 WHERE sku = %s", ("a",))
            # A handler that swallows the failure and goes on does not get its command done.
            tx.finish("c-1", "handled", [reply(1)])

    with pytest.raises(RuntimeFailure) as ended:
        swallowed()
    assert not isinstance(ended.value, RecordDataError)

    assert claim(store, "c-1") is None
    assert sql_backend.outbox() == []
    with store.transaction() as tx:
        assert tx.sql.execute("SELECT n FROM stock").fetchall() == [(1,)]
