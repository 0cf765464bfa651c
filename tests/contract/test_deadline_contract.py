"""One suite for every DeadlineStore: the in-memory one and PostgreSQL.

The two clocks differ (the memory store's is the test's, Postgres's is the server's), so the
cases never depend on exact times: rows are due hours ago or hours ahead, leases are expired by
moving the lease row or the clock well past the TTL.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Protocol

import psycopg
import pytest

from processor._errors import Retryable
from processor._memory.deadlines import MemoryDeadlineStore
from processor._ports import DeadlineStore
from processor._postgres.connect import connect, ensure_schema
from processor._postgres.deadlines import PostgresDeadlineStore
from processor._postgres.schema.tables import Tables
from processor._wire import deadline_channel
from tests.contract import BACKENDS, postgres_args
from tests.support.clocks import Offset

TTL = 60.0
HOUR = timedelta(hours=1)


class Backend(Protocol):
    store: DeadlineStore

    def add(self, due_in: timedelta, saga_id: str = "s-1") -> str:
        """Stores a deadline due ``due_in`` from the store's now; its id."""
        ...

    def dispatch(self, row_id: str) -> tuple[bool, int | None] | None:
        """(dispatched, token) of a row; None when it is gone."""
        ...

    def expire_lease(self) -> None: ...

    def park(self, saga_id: str) -> None:
        """Stores saga ``order``/``saga_id`` as parked."""
        ...

    def notify(self) -> None:
        """Announces a newly committed deadline, as a batch does."""
        ...

    def break_connection(self) -> None: ...

    def close(self) -> None: ...


class MemoryBackend:
    def __init__(self) -> None:
        self.clock = Offset()
        self.memory = MemoryDeadlineStore(self.clock.now)
        self.store: DeadlineStore = self.memory

    def add(self, due_in: timedelta, saga_id: str = "s-1") -> str:
        return self.memory.add("order", saga_id, "timeout", self.clock.now() + due_in)

    def dispatch(self, row_id: str) -> tuple[bool, int | None] | None:
        row = next((r for r in self.memory.rows() if r.id == row_id), None)
        return None if row is None else (row.dispatched_at is not None, row.dispatch_token)

    def expire_lease(self) -> None:
        self.clock.ahead += timedelta(seconds=TTL + 1)

    def park(self, saga_id: str) -> None:
        self.memory.park("order", saga_id)

    def notify(self) -> None:
        self.add(HOUR, f"n-{uuid.uuid4().hex[:6]}")

    def break_connection(self) -> None:
        self.memory.fail_next(1)

    def close(self) -> None:
        self.memory.close()


class PostgresBackend:
    def __init__(self, url: str, schema: str) -> None:
        self.tables = Tables(schema)
        ensure_schema(url, self.tables)
        self.name = f"contract-{uuid.uuid4().hex[:8]}"
        self.postgres = PostgresDeadlineStore(
            lambda: connect(url, application_name=self.name), self.tables
        )
        self.store: DeadlineStore = self.postgres
        self.admin = connect(url, autocommit=True)

    def _one(self, text: str, *args: object) -> tuple[object, ...] | None:
        return self.admin.execute(self.tables.render(text), args).fetchone()

    def add(self, due_in: timedelta, saga_id: str = "s-1") -> str:
        row = self._one(
            """
            INSERT INTO {deadline} (id, saga_type, saga_id, name, due_at, topic, partition)
            VALUES (gen_random_uuid(), 'order', %s, 'timeout', now() + %s, 'orders', 0)
            RETURNING id::text
            """,
            saga_id,
            due_in,
        )
        assert row is not None
        return str(row[0])

    def dispatch(self, row_id: str) -> tuple[bool, int | None] | None:
        row = self._one(
            "SELECT dispatched_at IS NOT NULL, dispatch_token FROM {deadline} WHERE id = %s",
            row_id,
        )
        if row is None:
            return None
        token = row[1]
        assert token is None or isinstance(token, int)
        return bool(row[0]), token

    def expire_lease(self) -> None:
        self.admin.execute(
            self.tables.render("UPDATE {deadline_lock} SET expires_at = now() - interval '1 s'")
        )

    def park(self, saga_id: str) -> None:
        self.admin.execute(
            self.tables.render(
                "INSERT INTO {instance} (saga_type, saga_id, status, version)"
                " VALUES ('order', %s, 'parked', 1)"
            ),
            (saga_id,),
        )

    def notify(self) -> None:
        self.add(HOUR, f"n-{uuid.uuid4().hex[:6]}")
        self._one("SELECT pg_notify(%s, '')", deadline_channel(self.tables.schema))

    def break_connection(self) -> None:
        killed = self._one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s",
            self.name,
        )
        assert killed == (1,)

    def close(self) -> None:
        self.postgres.close()
        self.admin.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    args = postgres_args(request)
    made: Backend = MemoryBackend() if args is None else PostgresBackend(*args)
    yield made
    made.close()


def _claim(
    b: Backend,
    holder: str,
    token: int,
    limit: int = 10,
    *,
    full: bool = False,
) -> tuple[list[str], float | None]:
    rows, due = b.store.claim_due(holder, token, limit, full=full)
    return [r.id for r in rows], due


def _acquire(b: Backend, holder: str) -> int:
    token = b.store.acquire(holder, TTL)
    assert token is not None
    return token


# -- the lease -----------------------------------------------------------------------------------


def test_the_lease_is_renewed_by_its_holder_and_refused_to_others(backend: Backend) -> None:
    token = _acquire(backend, "a")
    assert backend.store.acquire("a", TTL, token) == token
    assert backend.store.acquire("b", TTL) is None


def test_a_restarted_holder_of_the_same_name_waits_and_gets_a_larger_token(
    backend: Backend,
) -> None:
    old = _acquire(backend, "pod-0")
    # A new process under the same name does not know the token: it is not a renewal.
    assert backend.store.acquire("pod-0", TTL) is None
    assert backend.store.acquire("pod-0", TTL, old + 1) is None
    backend.expire_lease()
    new = _acquire(backend, "pod-0")
    assert new > old
    # The earlier incarnation, waking up, renews nothing.
    assert backend.store.acquire("pod-0", TTL, old) is None
    assert backend.store.acquire("pod-0", TTL, new) == new


def test_an_expired_lease_is_taken_with_a_larger_token(backend: Backend) -> None:
    old = _acquire(backend, "a")
    backend.expire_lease()
    new = _acquire(backend, "b")
    assert new > old
    assert backend.store.acquire("a", TTL, old) is None


def test_a_holder_whose_lease_expired_gets_a_new_token(backend: Backend) -> None:
    old = _acquire(backend, "a")
    backend.expire_lease()
    assert _acquire(backend, "a") > old


# -- claims --------------------------------------------------------------------------------------


def test_only_the_lease_holder_claims(backend: Backend) -> None:
    due = backend.add(-HOUR)
    old = _acquire(backend, "a")
    backend.expire_lease()
    new = _acquire(backend, "b")
    assert _claim(backend, "a", old, full=True)[0] == []  # the paused ex-leader
    assert _claim(backend, "a", new, full=True)[0] == []  # right token, wrong holder
    assert _claim(backend, "b", old, full=True)[0] == []  # right holder, stale token
    assert backend.dispatch(due) == (False, None)
    assert _claim(backend, "b", new)[0] == [due]
    assert backend.dispatch(due) == (True, new)


def test_a_claim_takes_due_rows_in_due_order_up_to_the_limit(backend: Backend) -> None:
    later = backend.add(-HOUR, "s-1")
    first = backend.add(-2 * HOUR, "s-2")
    backend.add(HOUR, "s-3")
    token = _acquire(backend, "a")
    assert _claim(backend, "a", token, limit=1)[0] == [first]
    ids, due = _claim(backend, "a", token, limit=5)
    assert ids == [later]
    # Fewer than the limit: the seconds until the next row comes due, from the same clock.
    assert due is not None
    assert 3500 < due <= 3600


def test_the_next_due_answer_is_none_when_nothing_is_pending(backend: Backend) -> None:
    token = _acquire(backend, "a")
    assert _claim(backend, "a", token) == ([], None)
    backend.add(-HOUR)
    ids, due = _claim(backend, "a", token)
    assert len(ids) == 1
    assert due is None
    assert backend.store.next_due_in() is None


def test_a_claim_returns_the_rows_fields(backend: Backend) -> None:
    did = backend.add(-HOUR, "s-9")
    token = _acquire(backend, "a")
    [row], _ = backend.store.claim_due("a", token, 10, full=False)
    assert (row.id, row.saga_type, row.saga_id, row.name) == (did, "order", "s-9", "timeout")
    assert row.due_at.tzinfo is not None


def test_a_fresh_claim_skips_dispatched_rows_and_a_full_one_takes_another_tokens(
    backend: Backend,
) -> None:
    did = backend.add(-HOUR)
    old = _acquire(backend, "a")
    assert _claim(backend, "a", old)[0] == [did]
    backend.expire_lease()
    new = _acquire(backend, "b")
    assert _claim(backend, "b", new)[0] == []
    assert _claim(backend, "b", new, full=True)[0] == [did]
    assert backend.dispatch(did) == (True, new)


def test_a_full_claim_never_takes_this_tokens_dispatched_rows_again(backend: Backend) -> None:
    # No timer: a record of the current token is redispatched only once the consumer made its
    # row due again (it was consumed without effect) or the poller unclaimed it.
    did = backend.add(-HOUR)
    token = _acquire(backend, "a")
    assert _claim(backend, "a", token)[0] == [did]
    assert _claim(backend, "a", token, full=True)[0] == []
    assert backend.dispatch(did) == (True, token)


def test_a_parked_sagas_rows_are_not_claimed(backend: Backend) -> None:
    held = backend.add(-HOUR, "s-parked")
    free = backend.add(-HOUR, "s-free")
    backend.park("s-parked")
    token = _acquire(backend, "a")
    assert _claim(backend, "a", token, full=True)[0] == [free]
    assert backend.dispatch(held) == (False, None)


def test_unclaim_makes_rows_of_the_token_due_again(backend: Backend) -> None:
    did = backend.add(-HOUR)
    token = _acquire(backend, "a")
    _claim(backend, "a", token)
    backend.store.unclaim([did], token + 1)
    assert backend.dispatch(did) == (True, token)
    backend.store.unclaim([did], token)
    assert backend.dispatch(did) == (False, token)
    assert _claim(backend, "a", token)[0] == [did]


def test_next_due_in_sees_only_rows_not_yet_due(backend: Backend) -> None:
    backend.add(-HOUR)
    assert backend.store.next_due_in() is None
    backend.add(2 * HOUR, "s-2")
    due = backend.store.next_due_in()
    assert due is not None
    assert 7100 < due <= 7200


# -- waiting and failures ------------------------------------------------------------------------


def test_wait_returns_at_once_on_wake_or_stop(backend: Backend) -> None:
    set_, unset = threading.Event(), threading.Event()
    set_.set()
    started = time.monotonic()
    backend.store.wait(30, set_, unset)
    backend.store.wait(30, unset, set_)
    assert time.monotonic() - started < 10


def test_wait_returns_when_a_deadline_is_committed(backend: Backend) -> None:
    backend.store.next_due_in()  # connected and listening
    stop, wake = threading.Event(), threading.Event()
    waiter = threading.Thread(target=backend.store.wait, args=(60, stop, wake), daemon=True)
    waiter.start()
    try:
        # Repeated: a notification sent before the waiter listens would be its only one.
        def notified() -> bool:
            backend.notify()
            return not waiter.is_alive()

        _wait(notified)
    finally:
        stop.set()
        waiter.join(5)


def test_wait_times_out(backend: Backend) -> None:
    started = time.monotonic()
    backend.store.wait(0.3, threading.Event(), threading.Event())
    assert time.monotonic() - started >= 0.25


def test_a_lost_connection_is_retryable_and_the_next_call_reconnects(backend: Backend) -> None:
    token = _acquire(backend, "a")
    backend.break_connection()
    with pytest.raises(Retryable):
        backend.store.acquire("a", TTL, token)
    assert backend.store.acquire("a", TTL, token) == token


def test_an_unreachable_database_is_retryable() -> None:
    store = PostgresDeadlineStore(
        lambda: psycopg.connect("postgresql://nobody@127.0.0.1:9/none", connect_timeout=2),
        Tables("nowhere"),
    )
    with pytest.raises(Retryable):
        store.next_due_in()
    store.close()


def _wait(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)
